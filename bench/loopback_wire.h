#ifndef MLASERVE_BENCH_LOOPBACK_WIRE_H_
#define MLASERVE_BENCH_LOOPBACK_WIRE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/loadgen/load_report.h"

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

// The round trips' times in microseconds.
absl::StatusOr<loadgen::Percentiles> MeasureLoopbackRoundTrip(const WireProbe& probe);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_LOOPBACK_WIRE_H_
