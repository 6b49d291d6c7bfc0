#ifndef MLASERVE_BENCH_TREE_COMMAND_H_
#define MLASERVE_BENCH_TREE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mlaserve::bench {

struct TreeCommandOptions {
  std::string model = "deepseek-v3";
  std::string profile = "ascend910";
  int shared = 2048;                      // tokens of the root prefix (a system prompt)
  int children = 4;                       // prefixes extending it (few-shot templates, tools, ...)
  int child_tokens = 1024;                // tokens each child adds
  std::vector<int> batch = {16, 32, 64};  // queries on each child
  int suffix = 128;                       // tokens each sequence has of its own
  int rounds = 2;                         // tree and flat alternate; best host time of the rounds
  int host_threads = 2;
  bool json = false;
};

// `mlaserve-bench tree`: a two-level prefix tree (a root, `children` prefixes on it, `batch`
// sequences on each child) decoded in one call through the whole engine on one emulated
// device, once with tree-aware TyphoonMLA grouping (the groups on the children share the
// root's naive pass) and once with flat grouping (each group decides alone and repeats the
// root's pass), alternating. Prints the plans (naive tokens, pass sharing), the modelled
// device time and the host time of the batch for both, and their ratios.
absl::Status RunTreeCommand(const TreeCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_TREE_COMMAND_H_
