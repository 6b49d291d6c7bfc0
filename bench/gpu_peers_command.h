#ifndef MLASERVE_BENCH_GPU_PEERS_COMMAND_H_
#define MLASERVE_BENCH_GPU_PEERS_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mlaserve::bench {

struct GpuPeersCommandOptions {
  std::string device = "cuda:0";
  // absorb: FlashMLA's dense decode, every (batch, heads, sq, sk) of the grids below;
  // typhoon: `model`'s heads on a shared prefix of `shared` tokens, each query with `suffix`
  // of its own, per batch of `typhoon_batch`: mlaserve's hybrid and absorb-only beside the
  // peers' absorb-only.
  std::string form = "absorb";
  std::vector<int> batch = {96};
  std::vector<int> heads = {128};
  std::vector<int> sq = {1};
  std::vector<int> sk = {4096};
  std::string model = "deepseek-v3";
  int shared = 4096;
  int suffix = 512;
  std::vector<int> typhoon_batch = {64, 128, 512};
  int page_size = 64;              // FlashMLA's only dense block size
  int repeats = 20;                // timed calls per side per round
  int rounds = 3;                  // alternations between the sides; the median of rounds x repeats
  std::string python = "python3";  // with torch (CUDA) and, on its path, flash_mla
  bool json = false;
};

// `mlaserve-bench gpu-peers`: mlaserve's GPU kernels beside FlashMLA's dense decode and a plain
// PyTorch absorb (bmm, softmax, bmm) on one GPU, on the same values: this side draws the inputs
// (seeded), writes them to a file in a fresh temporary directory and the peer
// (bench/peers/flashmla_worker.py) reads it, each side laying the cache out in its own pages.
// The sides alternate, each warmed, each timed with CUDA events around its calls; the table
// gives microseconds, TFLOP/s and GB/s counted as FlashMLA counts them, the ratios, and how far
// mlaserve's answers are from FlashMLA's.
absl::Status RunGpuPeersCommand(const GpuPeersCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_GPU_PEERS_COMMAND_H_
