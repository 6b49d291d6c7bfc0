#ifndef MLASERVE_BENCH_GPU_RESIDENT_INPUTS_H_
#define MLASERVE_BENCH_GPU_RESIDENT_INPUTS_H_

#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/typhoon_batch.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/gpu/gpu_lowering.h"
#include "kernels/gpu/gpu_runtime.h"
#include "kernels/mla/decode_batch.h"

namespace mlaserve::bench {

// A benchmark's inputs copied to the GPU once, as the server keeps its pool, weights and
// expansions there; a batch's input buffers resolve to the copies. Frees them when it goes.
class ResidentInputs {
 public:
  explicit ResidentInputs(gpu::GpuRuntime& runtime) : runtime_(runtime) {}
  ~ResidentInputs();
  ResidentInputs(const ResidentInputs&) = delete;
  ResidentInputs& operator=(const ResidentInputs&) = delete;

  // Host bytes [host, host + bytes) and every buffer within them.
  absl::Status Add(const void* host, int64_t bytes);
  // A device buffer of `bytes` filled with `pattern` over and over, which the buffer starting at
  // host address `name` resolves to: a pool of gigabytes from a few distinct pages (filling
  // gigabytes with fresh normals would take longer than the runs, and repeats cost a GPU the
  // same). `name` only names it; nothing is read there.
  absl::Status AddRepeated(const void* name, int64_t bytes, std::span<const std::byte> pattern);

  gpu::InputResolver resolver() const;

 private:
  gpu::GpuRuntime& runtime_;
  std::map<const std::byte*, std::pair<gpu::DevicePtr, int64_t>> copies_;
  std::map<const std::byte*, gpu::DevicePtr> named_;
};

// The inputs of `mlaserve-bench typhoon`'s batches (typhoon_batch.h): the pool, the layer's
// kv_b_proj and the prefix's expanded K/V.
absl::Status AddTyphoonInputs(ResidentInputs& inputs, const HostData& host);

// A batch's device time and answers.
struct GpuTimed {
  std::vector<double> us;  // each timed run's device time (CUDA events around the launches)
  int launches = 0;
  // Every member's answer of the last run, in member order, as float: out [sq][heads][width]
  // each, then (for groups that have them) the LSEs [sq][heads] each.
  std::vector<float> out, lse;

  double MedianUs() const;
};

// Runs `batch` (split over the SMs as the server splits, gpu::UseGpuSplit) `warmup + repeats`
// times on `executor`, timing the last `repeats`.
absl::StatusOr<GpuTimed> TimeOnGpu(gpu::GpuBatchExecutor& executor,
                                   const gpu::DeviceProperties& props, DecodeBatch batch,
                                   const ResidentInputs& inputs, int repeats, int warmup = 2);

// The middle value (the upper one of an even count); NaN for none.
double Median(std::vector<double> values);

// sqrt(sum (a - b)^2 / sum b^2); NaN where the two differ in length or are empty (an answer
// missing or of the wrong size never reads as agreement).
double RelativeRms(std::span<const float> a, std::span<const float> b);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_GPU_RESIDENT_INPUTS_H_
