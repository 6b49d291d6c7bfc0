#ifndef MLASERVE_KERNELS_NPU_DEVICE_KERNEL_H_
#define MLASERVE_KERNELS_NPU_DEVICE_KERNEL_H_

#include <string>

#include "absl/status/status.h"
#include "kernels/npu/program.h"

namespace mlaserve::npu {

// A kernel for the emulated device: a grid of `block_dim` groups of one AIC and two AIVs
// (KERNEL_TYPE_MIX_AIC_1_2), each running the program Record() issues for it.
class DeviceKernel {
 public:
  virtual ~DeviceKernel() = default;
  virtual std::string Name() const = 0;
  virtual int BlockDim() const = 0;
  // Useful floating-point work, for FLOPS utilisation (2 per multiply-accumulate).
  virtual double Flops() const = 0;
  virtual absl::Status Record(Program& program) const = 0;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_DEVICE_KERNEL_H_
