#ifndef MLASERVE_BENCH_LOOPBACK_WIRE_H_
#define MLASERVE_BENCH_LOOPBACK_WIRE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/loadgen/load_report.h"
#include "client/loadgen/workload.h"
#include "server/engine/model/model_config.h"

namespace mlaserve::bench {

// The floor under any RPC's edge cost on this machine: a plain TCP round trip on loopback
// carrying a call's request bytes one way and its response bytes back (no framing, no
// serialisation, no threads beyond the two ends), with the caller idle for `idle_between`
// before each call as a closed-loop client is while the device works.
struct WireProbe {
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
  int calls = 50;
  absl::Duration idle_between = absl::ZeroDuration();
};

// The tensor bytes one call of the workload carries (the protobuf framing around them is a
// few bytes per field): each query's q and appended row out, its output (bf16) and LSE (fp32)
// back.
WireProbe CallWireBytes(const engine::ModelConfig& model, const loadgen::WorkloadOptions& w);

// The round trips' times in microseconds.
absl::StatusOr<loadgen::Percentiles> MeasureLoopbackRoundTrip(const WireProbe& probe);

// The same floor between two hosts (or network namespaces): a far end listening on
// `listen` (HOST:PORT) answers every `request_bytes` it reads with `response_bytes`, one
// connection at a time, until the process ends; and the round trips to it from here.
absl::Status ServeWireEcho(const std::string& listen, int64_t request_bytes,
                           int64_t response_bytes);
absl::StatusOr<loadgen::Percentiles> MeasureRoundTripTo(const std::string& far_end,
                                                        const WireProbe& probe);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_LOOPBACK_WIRE_H_
