#include "client/loadgen/resource_drift.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace mlaserve::loadgen {
namespace {

double Mean(std::span<const double> v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

Drift DriftOf(std::span<const double> values, int window) {
  Drift d;
  const size_t w = std::min(values.size(), static_cast<size_t>(std::max(window, 1)));
  if (w == 0) return d;
  d.first = Mean(values.first(w));
  d.last = Mean(values.last(w));
  if (d.first != 0) {
    d.drift = (d.last - d.first) / d.first;
  } else if (d.last != 0) {
    // From nothing to something: growth without a scale.
    d.drift = std::numeric_limits<double>::infinity();
  }
  return d;
}

absl::StatusOr<ResourceDrift> ComputeResourceDrift(const std::vector<ResourceSample>& samples,
                                                   double warmup_s) {
  std::vector<double> rss, threads, fds, kv, outside_kv, heap;
  bool heap_everywhere = true;
  for (const ResourceSample& s : samples) {
    if (s.t_s < warmup_s) continue;
    if (s.heap_in_use_bytes.has_value()) {
      heap.push_back(*s.heap_in_use_bytes);
    } else {
      heap_everywhere = false;
    }
    rss.push_back(s.rss_bytes);
    threads.push_back(s.threads);
    fds.push_back(s.open_fds);
    kv.push_back(s.kv_resident_bytes);
    outside_kv.push_back(s.rss_bytes - s.kv_resident_bytes);
  }
  if (rss.size() < 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "drift needs at least two resource samples after the warm-up of ", warmup_s, " s, got ",
        rss.size(), ": lengthen --duration-s or shorten --soak-warmup-s or --soak-sample-s"));
  }
  ResourceDrift r;
  r.samples = static_cast<int>(rss.size());
  r.window = std::max(1, r.samples / 10);
  r.rss = DriftOf(rss, r.window);
  r.threads = DriftOf(threads, r.window);
  r.open_fds = DriftOf(fds, r.window);
  r.kv_resident = DriftOf(kv, r.window);
  r.rss_outside_kv = DriftOf(outside_kv, r.window);
  r.rss_outside_kv.drift =
      r.rss.first != 0 ? (r.rss_outside_kv.last - r.rss_outside_kv.first) / r.rss.first : 0;
  if (heap_everywhere) r.heap_in_use = DriftOf(heap, r.window);
  return r;
}

}  // namespace mlaserve::loadgen
