#ifndef MLASERVE_BENCH_KERNEL_COMMAND_H_
#define MLASERVE_BENCH_KERNEL_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mlaserve::bench {

struct KernelCommandOptions {
  std::string profile = "ascend910";
  std::vector<std::string> kernels = {"amla"};  // amla, base, snap (SnapMLA on the FP8 cache)
  int batch = 4;
  int heads = 128;
  std::vector<int> sq = {1};
  std::vector<int> sk = {4096};
  int preload = 2;
  int page_size = 128;
  int host_threads = 2;
  bool model_only = false;
  // Split-KV as the engine does it: a launch with fewer row groups than AIC blocks cuts their
  // keys over the blocks and merges the parts (the merge launch is part of the time).
  bool split_kv = false;
  int repeats = 3;  // executed runs: best of this many, kernel and SGEMM alternating
  bool json = false;
};

// `mlaserve-bench kernel`: runs decode attention on an emulated device for every
// (kernel, sq, sk) combination and prints modelled time, FLOPS utilisation, pipe busy
// fractions and, unless --model-only, the host execution rate beside the same-run SGEMM
// rate on the kernel's own matrix-unit shapes.
absl::Status RunKernelCommand(const KernelCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_KERNEL_COMMAND_H_
