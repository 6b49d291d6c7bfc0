#ifndef MLASERVE_KERNELS_MLA_HOST_BATCH_RUNNER_H_
#define MLASERVE_KERNELS_MLA_HOST_BATCH_RUNNER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/core/job_pool.h"
#include "kernels/mla/batch_steps.h"

namespace mlaserve {

// Runs a batch's steps (batch_steps.h) with the host kernels: projections as MatmulBf16,
// attention row groups as AmlaRows / FlashBaseRows, merges as CombineLseParts. The jobs of a
// step are spread over the runner's threads. One Run at a time.
class HostBatchRunner {
 public:
  // How a batch should be split for this runner (DecodeBatch's split fields): the host
  // kernels take a part of any length, so split-KV parts are multiples of 64 keys rather than
  // the NPU kernels' 512-key blocks, which let a lone query of 1K keys keep 2 threads busy
  // where 16 wait (docs/performance.md 11.3); a part's own cost (its query widened, its
  // merge) is about two such blocks.
  static constexpr int kSplitBlockTokens = 64;
  static constexpr int kSplitPartOverheadBlocks = 2;

  explicit HostBatchRunner(int threads = 1) : pool_(threads) {}

  int threads() const { return pool_.threads(); }
  // The buffers after the last step (outputs and scratch alike). INTERNAL for steps that
  // fail ValidateBatchSteps.
  absl::StatusOr<std::unique_ptr<BatchBuffers>> Run(const BatchSteps& steps);

 private:
  JobPool pool_;
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_HOST_BATCH_RUNNER_H_
