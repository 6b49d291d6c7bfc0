#ifndef MLASERVE_BENCH_PEERS_COMMAND_H_
#define MLASERVE_BENCH_PEERS_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mlaserve::bench {

struct PeersCommandOptions {
  std::vector<std::string> forms = {"absorb"};  // absorb (latent attention) and/or naive
  std::vector<int> batch = {1, 4, 16, 64};
  std::vector<int> heads = {64, 128};
  std::vector<int> sq = {1, 2};
  std::vector<int> sk = {1024, 4096, 16384};
  int threads = 2;  // both sides
  int repeats = 2;  // timed runs per side per round
  int rounds = 2;   // alternations between the sides; best of rounds x repeats
  std::string python = "/usr/bin/python3";
  // "tuned": the peer at its best on this machine (AVX-512 dispatch, OpenBLAS's own kernel
  // choice, huge pages for its large allocations); "as-is": the environment unchanged.
  std::string peer_env = "tuned";
  // Which of mlaserve's devices runs its side: "host" (the host device's steps) or "npu" (the
  // emulated device of `profile`, with `threads` host threads, split-KV over its cube cores
  // as the server splits; each batch launched and executed as the server's device does).
  std::string device = "host";
  std::string profile = "ascend910-die";
  bool json = false;
};

// `mlaserve-bench peers`: mlaserve's host kernels (the host device's steps on `threads`
// threads, or the emulated device's execution of them) beside PyTorch on the CPU (python3-torch:
// bmm, softmax, bmm in fp32 and in bf16), same shapes, same run, alternating, best of N, with the
// ratio to the faster peer. The absorb form is the latent attention of a decode batch (q already
// absorbed: B x H x Sq rows over Sk cached tokens each); the naive form is TyphoonMLA's
// shared-prefix pass (B x Sq queries per head over one prefix's expanded K/V).
absl::Status RunPeersCommand(const PeersCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_PEERS_COMMAND_H_
