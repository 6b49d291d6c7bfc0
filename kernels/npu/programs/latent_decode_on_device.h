#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_LATENT_DECODE_ON_DEVICE_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_LATENT_DECODE_ON_DEVICE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/latent_decode.h"
#include "kernels/npu/device.h"
#include "kernels/npu/launch_report.h"
#include "kernels/npu/programs/attention_device_kernel.h"

namespace mlaserve::npu {

// The shape of a latent decode batch, for modelling its time without any data.
struct LatentDecodeShape {
  int heads = 128;
  int sq = 1;
  std::vector<int32_t> seqlens;
  int dk = 576;
  int dv = 512;
  int page_size = 128;
  bool causal = true;
};

// A paged latent decode batch (FlashMLA's problem) mapped into a device's global memory and
// turned into an AttentionDeviceKernel: each request's sq x heads rows become row groups of at most
// 256 rows over its pages. The cache pages are mapped, not copied. Owns every GM buffer of
// the launch and returns them on destruction.
class LatentDecodeLaunch {
 public:
  // For execution: q is copied in, the pool mapped, outputs allocated.
  static absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> Prepare(
      Device& device, const LatentDecodeProblem& problem, const AttentionDeviceKernelOptions& options);
  // For modelling only: addresses without host memory.
  static absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> PrepareModel(
      Device& device, const LatentDecodeShape& shape, const AttentionDeviceKernelOptions& options);

  ~LatentDecodeLaunch();
  LatentDecodeLaunch(const LatentDecodeLaunch&) = delete;
  LatentDecodeLaunch& operator=(const LatentDecodeLaunch&) = delete;

  // Null when no row sees any key (nothing to launch).
  const AttentionDeviceKernel* kernel() const { return kernel_.get(); }
  // The outputs after the kernel ran; rows without keys read as zeros and -inf, the answer
  // a kernel's early exit gives.
  AttentionOutput ReadOutput() const;

 private:
  explicit LatentDecodeLaunch(GlobalMemory& gm) : gm_(gm) {}
  absl::Status Build(int heads, int sq, std::span<const int32_t> seqlens, bool causal, int dk,
                     int dv, float scale, int page_size, int width,
                     const std::function<int32_t(int, int)>& page_of,
                     const AttentionDeviceKernelOptions& options, int max_blocks, bool backed);

  GlobalMemory& gm_;
  std::vector<GmBuffer> owned_;  // released on destruction
  GmBuffer q_, pool_, out_, lse_;
  int64_t rows_ = 0;
  int dv_ = 0;
  AttentionWorkload workload_;
  std::unique_ptr<AttentionWorkspace> workspace_;
  std::unique_ptr<AttentionDeviceKernel> kernel_;
};

struct DeviceDecodeResult {
  AttentionOutput output;  // same layout as the host kernels': [batch][sq][heads][dv]
  LaunchReport report;
};

// Prepares, launches and reads back a latent decode batch on the emulated device.
absl::StatusOr<DeviceDecodeResult> RunLatentDecodeOnDevice(Device& device,
                                                           const LatentDecodeProblem& problem,
                                                           const AttentionDeviceKernelOptions& options = {});

// Models the same launch with no host arithmetic and no host memory for the cache, so
// paper-sized batches model in seconds.
absl::StatusOr<LaunchReport> ModelLatentDecodeOnDevice(Device& device, const LatentDecodeShape& shape,
                                                       const AttentionDeviceKernelOptions& options = {});

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_LATENT_DECODE_ON_DEVICE_H_
