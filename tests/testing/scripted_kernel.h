#ifndef MLASERVE_TESTS_TESTING_SCRIPTED_KERNEL_H_
#define MLASERVE_TESTS_TESTING_SCRIPTED_KERNEL_H_

#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/npu/device_kernel.h"
#include "kernels/npu/program.h"

namespace mlaserve::testing {

// A device kernel whose body is a lambda over the program.
class ScriptedKernel final : public npu::DeviceKernel {
 public:
  ScriptedKernel(int blocks, std::function<absl::Status(npu::Program&)> body,
                 std::string name = "scripted")
      : blocks_(blocks), body_(std::move(body)), name_(std::move(name)) {}
  std::string Name() const override { return name_; }
  int BlockDim() const override { return blocks_; }
  double Flops() const override { return 0; }
  absl::Status Record(npu::Program& program) const override {
    RETURN_IF_ERROR(body_(program));
    return program.status();
  }

 private:
  int blocks_;
  std::function<absl::Status(npu::Program&)> body_;
  std::string name_;
};

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_SCRIPTED_KERNEL_H_
