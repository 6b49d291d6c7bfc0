#ifndef MLASERVE_BENCH_SERVICE_COMMAND_H_
#define MLASERVE_BENCH_SERVICE_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "client/loadgen/workload.h"

namespace mlaserve::bench {

struct ServiceCommandOptions {
  std::string model = "deepseek-v3";
  int layers = 2;
  std::string profile;  // empty: the engine's default
  int devices = 2;
  int rounds = 2;  // direct and gRPC alternate this many times
  loadgen::WorkloadOptions workload;
  bool json = false;
};

// `mlaserve-bench service`: the same closed-loop workload against the engine called directly
// and through the gRPC server on loopback (same process, same engine options), alternating,
// and the ratio of their throughputs, with each path's latency and per-call overhead.
absl::Status RunServiceCommand(const ServiceCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_SERVICE_COMMAND_H_
