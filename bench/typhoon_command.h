#ifndef MLASERVE_BENCH_TYPHOON_COMMAND_H_
#define MLASERVE_BENCH_TYPHOON_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/gpu/gpu_runtime.h"
#include "server/engine/plan/planner.h"

namespace mlaserve::bench {

struct TyphoonCommandOptions {
  std::string model = "deepseek-v3";
  std::string profile = "ascend910";
  double matrix_tflops = 0;  // 0: the profile's peak
  double hbm_tbps = 0;       // 0: the profile's bandwidth
  std::vector<int> sq = {1};
  int shared = 4096;  // Ls: tokens of the prefix every query shares
  int suffix = 512;   // Ln: tokens each query has of its own
  std::vector<int> batch = {16, 32, 64, 128, 256, 512, 1024};
  int page_size = 128;
  int preload = 2;
  int host_threads = 2;
  bool model_only = false;
  bool json = false;
  std::string device;  // a GPU (cuda:N, fake-gpu) instead of the emulated NPU
  int repeats = 20;    // on a GPU: timed runs of each batch, the median reported
};

// `mlaserve-bench typhoon`: one group of B head-space queries on a shared prefix, run as
// absorb-only and as the TyphoonMLA hybrid (naive over the prefix's expanded K/V, absorb
// over each suffix, LSE combine), both as the engine's batch steps lowered onto an
// emulated device. Prints B_theta, the planner's choice, the modelled (and, executed, host)
// times of both and their ratio, and how far the two answers are apart.
absl::Status RunTyphoonCommand(const TyphoonCommandOptions& options, std::ostream& out);

// The same batches on a GPU (bench/gpu_typhoon_command.cc): the device's own time for each
// (CUDA events, the median of `repeats` runs), the inputs resident as the server keeps them.
absl::Status RunGpuTyphoonCommand(const TyphoonCommandOptions& options, std::ostream& out);

// The rates the engine's planner takes for the GPU `props` (its kernels' attained shares of the
// peak), or the options' overrides: what B_theta comes from.
engine::DeviceRates GpuTyphoonRates(const gpu::DeviceProperties& props,
                                    const TyphoonCommandOptions& options);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_TYPHOON_COMMAND_H_
