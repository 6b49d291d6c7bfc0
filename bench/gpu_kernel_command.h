#ifndef MLASERVE_BENCH_GPU_KERNEL_COMMAND_H_
#define MLASERVE_BENCH_GPU_KERNEL_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mlaserve::bench {

struct GpuKernelCommandOptions {
  std::string device = "cuda:0";  // or fake-gpu
  std::string kernel = "amla";    // amla: the bf16 cache; snap: the FP8 cache
  int batch = 96;
  int heads = 128;
  std::vector<int> sq = {1};
  std::vector<int> sk = {4096};
  int page_size = 64;  // FlashMLA's block size
  int repeats = 20;
  bool json = false;
  // Each shape in the batch-invariant mode too (DecodeBatch::batch_invariant), its runs
  // alternating with the default's; parts of invariant_part_tokens keys (0: the default).
  bool batch_invariant = false;
  int invariant_part_tokens = 0;
};

// `mlaserve-bench kernel --device=cuda:0`: FlashMLA's dense-decode problem (latent-space
// queries over a paged cache, every request `sk` keys) run through the GPU device's own path
// (the batch's steps, lowered and run as the server runs them, split-KV over the SMs), timed
// with the device's events around the launches: microseconds, TFLOP/s counted as FlashMLA
// counts them (2 B sq H sk (dk + dv)) and the cache's bytes per second. With
// `batch_invariant`, the mode's time beside it and their ratio.
absl::Status RunGpuKernelCommand(const GpuKernelCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_GPU_KERNEL_COMMAND_H_
