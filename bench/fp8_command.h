#ifndef MLASERVE_BENCH_FP8_COMMAND_H_
#define MLASERVE_BENCH_FP8_COMMAND_H_

#include <ostream>

#include "absl/status/status.h"

namespace mlaserve::bench {

struct Fp8CommandOptions {
  int seeds = 3;
  int heads = 64;
  int sq = 1;
  int context = 4096;  // keys per sequence
  int sequences = 2;
  double data_scale = 0.1;  // KvDataSampler's scale (scores grow with its square)
  bool json = false;
};

// `mlaserve-bench fp8`: the FP8 latent cache's accuracy per data set and KV format against
// the fp64 golden on unquantised data (docs/numerics.md, "FP8 accuracy"). The served formats
// run their real kernels (bf16: AMLA; fp8-rope-aware: SnapMLA over AMLA, which also quantises
// Q and P, and "kernel-q-bf16" the same with bf16 queries); every format, SnapMLA's Table 2
// ablations among them, also runs "kv-only": fp64 attention over its dequantised keys, which
// isolates what holding the cache in it costs.
absl::Status RunFp8Command(const Fp8CommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_FP8_COMMAND_H_
