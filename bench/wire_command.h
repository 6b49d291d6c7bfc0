#ifndef MLASERVE_BENCH_WIRE_COMMAND_H_
#define MLASERVE_BENCH_WIRE_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "client/loadgen/workload.h"

namespace mlaserve::bench {

struct WireCommandOptions {
  std::string model = "deepseek-v3";
  int layers = 2;
  // The far end's role: answer raw TCP round trips of the workload's bytes on HOST:PORT.
  std::string listen;
  // The caller's role: the server (gRPC, its UCX plane advertised) and the far end.
  std::string target;
  std::string echo;
  int rounds = 3;
  loadgen::WorkloadOptions workload;
};

// `mlaserve-bench wire` (scripts/ucx_wire_bench.sh runs it between two network namespaces):
// the workload's calls over the server's UCX data plane and a raw TCP socket pair moving the
// same bytes there and back, alternating round by round, warmed, in one run: how far the UCX
// plane's transport cost (a call's latency less the server's own time) is above the wire's.
absl::Status RunWireCommand(const WireCommandOptions& options, std::ostream& out);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_WIRE_COMMAND_H_
