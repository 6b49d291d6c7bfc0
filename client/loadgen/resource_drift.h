#ifndef MLASERVE_CLIENT_LOADGEN_RESOURCE_DRIFT_H_
#define MLASERVE_CLIENT_LOADGEN_RESOURCE_DRIFT_H_

#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace mlaserve::loadgen {

// The server's process as its /metrics reported it at one moment of a soak run.
struct ResourceSample {
  double t_s = 0;  // since the run started
  double rss_bytes = 0;
  double threads = 0;
  double open_fds = 0;
  // The server's KV pool pages that have been written and so stay resident
  // (mlaserve_kv_bytes{kind="resident"}): bounded by --kv_budget, growing only while more
  // pages are in use at once than ever before.
  double kv_resident_bytes = 0;
  // The allocator's bytes in use (mlaserve_heap_in_use_bytes); absent when the server's
  // malloc is a sanitizer's. Growth here is a leak; growth of RSS alone is memory held.
  std::optional<double> heap_in_use_bytes = std::nullopt;
};

// How far a resource moved over a run: the mean of the last window against the mean of the
// first window after warm-up. A leak shows as a drift that grows with the run's length;
// noise (allocator arenas, gRPC's thread pool) averages out over a window.
struct Drift {
  double first = 0;  // mean of the first window after warm-up
  double last = 0;   // mean of the last window
  double drift = 0;  // (last - first) / first; 0 when both are 0
};

struct ResourceDrift {
  int samples = 0;  // after warm-up
  int window = 0;   // samples per window
  Drift rss, threads, open_fds;
  Drift kv_resident;
  // RSS less the KV pool's resident pages, with its drift taken against the whole RSS: the
  // growth the pool does not account for, which is what a leak would show as. The soak's
  // gate (--soak-max-rss-drift) applies to this drift.
  Drift rss_outside_kv;
  // Present when every sample after warm-up has the heap's in-use bytes.
  std::optional<Drift> heap_in_use;
};

// Drift of `values` with windows of `window` samples at each end (they overlap when
// values.size() < 2 * window). Needs at least one value and window >= 1.
Drift DriftOf(std::span<const double> values, int window);

// The drifts of every resource over the samples taken at or after `warmup_s`, with windows of
// a tenth of them (at least one sample each), so a window spans the same share of any run.
// FAILED_PRECONDITION if fewer than two samples fall after the warm-up.
absl::StatusOr<ResourceDrift> ComputeResourceDrift(const std::vector<ResourceSample>& samples,
                                                   double warmup_s);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_RESOURCE_DRIFT_H_
