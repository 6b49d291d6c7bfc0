#ifndef MLASERVE_TESTS_TESTING_GPU_BATCH_CHECKS_H_
#define MLASERVE_TESTS_TESTING_GPU_BATCH_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/gpu/gpu_lowering.h"
#include "kernels/gpu/gpu_runtime.h"
#include "kernels/mla/batch_steps.h"
#include "tests/testing/attention_checks.h"
#include "tests/testing/batch_invariance_check.h"
#include "tests/testing/decode_batch_scenario.h"

namespace mlaserve::testing {

// A batch's input buffers (KV pool, weights, expanded K/V) copied to a GPU once, as a device
// keeps them resident, and a resolver that finds them there.
class ResidentInputs {
 public:
  static absl::StatusOr<ResidentInputs> Upload(gpu::GpuRuntime& runtime, const BatchSteps& steps);
  ResidentInputs(ResidentInputs&&) = default;
  ~ResidentInputs();

  gpu::InputResolver resolver() const;

 private:
  explicit ResidentInputs(gpu::GpuRuntime& runtime) : runtime_(&runtime) {}
  gpu::GpuRuntime* runtime_;
  std::map<const void*, gpu::DevicePtr> placed_;  // by the buffer's host memory
};

// The answer tolerances every GPU is held to against the fp64 golden: FlashMLA's
// (check_is_allclose) for bf16 groups, with the absolute bound scaled to the data and the
// cosine bound of the absorb form's bf16 casts in head space; SnapMLA's bounds for FP8 groups.
inline constexpr Tolerance kGpuOutTolerance{FlashMlaOutTolerance(1.0).abs_tol, 2.01 / 128, 2e-5};
// Head-space answers go through the absorb form's two extra bf16 casts (the projected query,
// whose 2^-9 relative error moves every score, and the latent output before the value
// projection) and the projections' sums: their errors reach about 1 % of the answers' scale,
// where FlashMLA's absolute bound (8e-4 for answers of scale 0.1) allows 0.8 %. Held to that
// bound, one element in 2,048 of the head-space MTP batch fell out (0.008-0.011) in about one
// seed in 30, on all three CUDA kernels alike (the same seed fails each the same way). So in
// head space the absolute bound is 2.5 times FlashMLA's, scaled to the larger of the data's
// sigma and the golden answers' RMS; the relative and cosine bounds stay.
Tolerance HeadSpaceOutTolerance(std::span<const double> golden);
inline constexpr Tolerance kGpuLseTolerance{1e-2, 8.01 / 65536, 0.0};

// The batches a GPU is held to: every standard and FP8 batch (few heads), and the served
// model's shapes (128 heads, thousands of keys, MTP, split-KV over the SMs, a shared prefix
// in naive form, bf16 and FP8), at FlashMLA's data scale.
std::vector<NamedScenario> GpuScenarios();

// Runs a scenario's batch on `runtime` through the GPU lowering (inputs resident, queries
// uploaded) and checks every answer against the golden. With `runs` > 1 the same executor
// runs it that many times (as a decode step repeats its predecessor's launches) and every
// run's answers must equal the first's bit for bit.
void ExpectGpuBatchMatchesGolden(gpu::GpuRuntime& runtime, const NamedScenario& scenario,
                                 uint64_t seed, int runs = 1);

// A GPU as the engine's device uses it, for the batch-invariance check: the batch split over
// its SMs (UseGpuSplit), inputs resident, queries uploaded.
BatchRunner GpuBatchRunner(gpu::GpuRuntime& runtime);

// Every output buffer of a run, concatenated in step-buffer order: two runs of the same steps
// answered alike exactly when these are equal.
std::vector<std::byte> AllOutputBytes(const BatchSteps& steps, const BatchBuffers& buffers);

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_GPU_BATCH_CHECKS_H_
