#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_BATCH_LAUNCH_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_BATCH_LAUNCH_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/mla/batch_steps.h"
#include "kernels/npu/device.h"
#include "kernels/npu/launch_report.h"
#include "kernels/npu/programs/attention_device_kernel.h"

namespace mlaserve::npu {

struct BatchLaunchReport {
  std::vector<LaunchReport> launches;  // in stream order
  double modeled_us = 0;               // their sum: one stream runs them back to back
};

// A batch's steps (kernels/mla/batch_steps.h) lowered onto one emulated NPU: input buffers
// mapped into its global memory (not copied), scratch and outputs allocated there, the
// queries staged (the host-to-device copy), and each step one kernel launch on one stream:
//   ProjectionStep -> ProjectionKernel      (cube)
//   AttentionStep  -> AttentionDeviceKernel (cube + vector, the AMLA paper's pipeline)
//   CombineStep    -> CombineKernel         (vector)
// Each kernel computes exactly what the host runner computes for its step, so the answers
// equal HostBatchRunner's bit for bit.
//
// A model-only launch (backed = false) reserves addresses without host memory: inputs may
// then be null and nothing is staged. Owns what it allocates and mapped; releases it on
// destruction, so it must not outlive the device. Implements BatchBuffers over the device's
// memory after an executed Run.
class BatchLaunch final : public BatchBuffers {
 public:
  static absl::StatusOr<std::unique_ptr<BatchLaunch>> Create(
      Device& device, const BatchSteps& steps, const AttentionDeviceKernelOptions& options,
      bool backed);
  ~BatchLaunch() override;
  BatchLaunch(const BatchLaunch&) = delete;
  BatchLaunch& operator=(const BatchLaunch&) = delete;

  absl::StatusOr<BatchLaunchReport> Run(ExecutionMode mode);

  std::span<const std::byte> Bytes(int buffer) const override;
  // The launches, in stream order (tests record them with their own executors).
  const std::vector<std::unique_ptr<DeviceKernel>>& kernels() const { return kernels_; }

 private:
  struct AttentionLaunch;

  BatchLaunch(Device& device, bool backed);
  absl::Status Place(const BatchSteps& steps);
  void Stage(const BatchSteps& steps);
  absl::Status Lower(const BatchSteps& steps, const AttentionDeviceKernelOptions& options);
  GmBuffer At(const BufferRef& ref) const;

  Device& device_;
  const bool backed_;
  std::vector<GmBuffer> buffers_;       // by step buffer id; allocated or mapped here,
                                        // released on destruction
  std::vector<int64_t> element_bytes_;  // by step buffer id
  std::vector<std::unique_ptr<AttentionLaunch>> attention_;
  std::vector<std::unique_ptr<DeviceKernel>> kernels_;  // in stream order
};

// A batch's launches as one report: modelled cycles, flops, bytes and host times summed,
// pipe busy weighted by each launch's time, FU of the whole over the device's peak.
LaunchReport Summarize(const BatchLaunchReport& report, const DeviceProfile& profile);

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_BATCH_LAUNCH_H_
