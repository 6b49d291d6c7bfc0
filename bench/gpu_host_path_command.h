#ifndef MLASERVE_BENCH_GPU_HOST_PATH_COMMAND_H_
#define MLASERVE_BENCH_GPU_HOST_PATH_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mlaserve::bench {

struct GpuHostPathCommandOptions {
  std::string device = "cuda:0";
  std::vector<int> batch = {1, 8, 72};
  int heads = 128;
  int keys = 1152;  // make demo's sequences: a 1,024-token prefix and 128 of their own
  int repeats = 50;
  int rounds = 3;
};

// `mlaserve-bench hostpath --device=cuda:0`: a decode step in head space (absorb_q, the
// attention, project_out) of B sequences run through the GPU device's own path, as the server
// runs one, by four runtimes of the same GPU side by side: the projections on the tiled GEMM
// or the row kernel, each launch enqueued or the sequence replayed as a CUDA graph. Rounds
// alternate the four, each warmed; per variant the median of the device's kernel time (CUDA
// events) and of the host's wall time for the whole run (lowering, upload, launches,
// download, synchronisation). Needs a build with CUDA.
absl::Status RunGpuHostPathCommand(const GpuHostPathCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_GPU_HOST_PATH_COMMAND_H_
