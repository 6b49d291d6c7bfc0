#ifndef MLASERVE_BENCH_SERVICE_COMMAND_H_
#define MLASERVE_BENCH_SERVICE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/loadgen/workload.h"

namespace mlaserve::bench {

struct ServiceCommandOptions {
  std::string model = "deepseek-v3";
  int layers = 2;
  std::string profile;  // empty: the engine's default
  int devices = 2;
  std::string gpu;  // a GPU instead of the CPU pool (cuda:N, fake-gpu)
  int rounds = 2;   // the paths alternate this many times
  // The paths compared, in this order each round: direct (the engine in process), grpc (a
  // message per query, gRPC listening itself), guarded (the same behind the HTTP/2 guard,
  // the server's default), packed (gRPC's packed form behind the guard), shm (the same-host
  // data plane), ucx (the UCX data plane on loopback; not in the default list), invariant
  // (direct with every call batch-invariant, EngineOptions::batch_invariant; not in the
  // default list either).
  std::vector<std::string> paths = {"direct", "grpc", "guarded", "packed", "shm"};
  loadgen::WorkloadOptions workload;
  bool json = false;
};

// `mlaserve-bench service`: the same closed-loop workload against the engine called directly
// and through the server on loopback by each transport (same process, same engine options),
// alternating, and the ratios of their throughputs, with each path's latency and per-call
// overhead.
absl::Status RunServiceCommand(const ServiceCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_SERVICE_COMMAND_H_
