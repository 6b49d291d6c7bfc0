#ifndef MLASERVE_BENCH_CAPACITY_COMMAND_H_
#define MLASERVE_BENCH_CAPACITY_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace mlaserve::bench {

struct CapacityCommandOptions {
  std::string model = "deepseek-v3";
  std::string profile = "ascend910-die";
  int64_t budget_mib = 256;
  int context = 4096;  // tokens per sequence
  int rounds = 3;      // decode steps over every held sequence (the first is a warm-up)
  int host_threads = 2;
  bool json = false;
};

// `mlaserve-bench capacity`: SnapMLA's end-to-end argument on one engine. At a fixed KV
// budget, as many sequences of `context` tokens as fit are created in each format (bf16,
// FP8), then every held sequence is decoded once per step, in batches of up to 256: tokens and
// sequences held, modelled device time and host time per step, and queries per second, FP8
// beside bf16.
absl::Status RunCapacityCommand(const CapacityCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_CAPACITY_COMMAND_H_
