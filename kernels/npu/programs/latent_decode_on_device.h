#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_LATENT_DECODE_ON_DEVICE_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_LATENT_DECODE_ON_DEVICE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/latent_decode.h"
#include "kernels/mla/batch_step_builder.h"
#include "kernels/mla/snap_amla.h"
#include "kernels/npu/device.h"
#include "kernels/npu/launch_report.h"
#include "kernels/npu/programs/attention_device_kernel.h"
#include "kernels/npu/programs/batch_launch.h"

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
  KvDtype kv_dtype = KvDtype::kBf16;  // fp8: SnapMLA over AMLA on the FP8 cache
};

// A paged latent decode batch (FlashMLA's problem) on one emulated device, through the same
// path a served batch takes: one latent-space group of a DecodeBatch, its steps
// (kernels/mla/batch_step_builder.h), lowered by BatchLaunch. Without split-KV
// (parallel_units = 1, the AMLA paper's setup) that is one attention launch; with it, the
// attention launch and the merge of its parts. The cache pages are mapped, not copied.
class LatentDecodeLaunch {
 public:
  // For execution: the queries staged, the pool mapped, outputs allocated.
  static absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> Prepare(
      Device& device, const LatentDecodeProblem& problem,
      const AttentionDeviceKernelOptions& options, int parallel_units = 1);
  // The same over the FP8 cache (SnapMLA over AMLA); outputs are dl wide.
  static absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> PrepareFp8(
      Device& device, const Fp8LatentDecodeProblem& problem,
      const AttentionDeviceKernelOptions& options, int parallel_units = 1);
  // For modelling only: addresses without host memory.
  static absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> PrepareModel(
      Device& device, const LatentDecodeShape& shape, const AttentionDeviceKernelOptions& options,
      int parallel_units = 1);

  BatchLaunch& launch() { return *launch_; }
  // The attention launch (null when no row sees any key: nothing to launch).
  const DeviceKernel* kernel() const;
  // The outputs after the launches ran, in the host kernels' layout [batch][sq][heads][dv]:
  // rows without keys read as zeros and -inf, the answer a kernel's early exit gives.
  AttentionOutput ReadOutput() const;

 private:
  // One latent group, a member per page table in pages_ (queries[m] its q, null to model
  // only), lowered onto `device` with the batch's shape already in `batch`.
  absl::Status Lower(Device& device, DecodeBatch batch, int sq, bool causal,
                     std::span<const int32_t> lengths, std::span<const Bf16* const> queries,
                     const AttentionDeviceKernelOptions& options, bool backed,
                     KvDtype kv_dtype = KvDtype::kBf16);

  LatentDecodeLaunch() = default;

  std::vector<std::vector<int32_t>> pages_;  // per request, viewed by the batch
  BuiltBatch built_;
  std::unique_ptr<BatchLaunch> launch_;
};

struct DeviceDecodeResult {
  AttentionOutput output;  // same layout as the host kernels': [batch][sq][heads][dv]
  LaunchReport report;     // every launch of the batch, summed (Summarize)
};

// Prepares, launches and reads back a latent decode batch on the emulated device.
absl::StatusOr<DeviceDecodeResult> RunLatentDecodeOnDevice(
    Device& device, const LatentDecodeProblem& problem,
    const AttentionDeviceKernelOptions& options = {}, int parallel_units = 1);

absl::StatusOr<DeviceDecodeResult> RunFp8LatentDecodeOnDevice(
    Device& device, const Fp8LatentDecodeProblem& problem,
    const AttentionDeviceKernelOptions& options = {}, int parallel_units = 1);

// Models the same launches with no host arithmetic and no host memory for the cache, so
// paper-sized batches model in seconds.
absl::StatusOr<LaunchReport> ModelLatentDecodeOnDevice(
    Device& device, const LatentDecodeShape& shape,
    const AttentionDeviceKernelOptions& options = {}, int parallel_units = 1);

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_LATENT_DECODE_ON_DEVICE_H_
