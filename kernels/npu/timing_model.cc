#include "kernels/npu/timing_model.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/npu/l2_cache_model.h"

namespace mlaserve::npu {
namespace {

// A first-come-first-served bandwidth server (the die's L2 or HBM port).
class BandwidthServer {
 public:
  explicit BandwidthServer(double bytes_per_cycle) : bytes_per_cycle_(bytes_per_cycle) {}
  // Serves `bytes` arriving at `t`; returns when the last byte is through.
  double Serve(double t, int64_t bytes) {
    if (bytes <= 0) return t;
    free_at_ = std::max(free_at_, t) + static_cast<double>(bytes) / bytes_per_cycle_;
    return free_at_;
  }

 private:
  double bytes_per_cycle_;
  double free_at_ = 0;
};

}  // namespace

absl::StatusOr<LaunchTiming> SimulateLaunch(const Program& program, const DeviceProfile& profile) {
  const std::vector<Instruction>& ins = program.instructions();
  const size_t n = ins.size();
  const auto& offsets = program.edge_offsets();
  const auto& edges = program.edges();
  std::vector<uint32_t> pending = program.in_degree();
  std::vector<double> ready(n, 0.0), start(n, 0.0), finish(n, 0.0), done(n, 0.0);
  std::vector<char> processed(n, 0);
  // Completion of everything issued so far on each (core, pipe): what a set waits for.
  std::vector<double> pipe_done(static_cast<size_t>(program.num_cores()) * kNumPipes, 0.0);

  L2CacheModel l2(profile.l2_bytes, profile.l2_line_bytes);
  BandwidthServer l2_port(profile.l2_bytes_per_cycle);
  BandwidthServer hbm_port(profile.hbm_bytes_per_cycle);

  using Item = std::pair<double, uint32_t>;  // (ready time, id): ties broken by id
  std::priority_queue<Item, std::vector<Item>, std::greater<>> queue;
  for (uint32_t i = 0; i < n; ++i) {
    if (pending[i] == 0) queue.emplace(0.0, i);
  }

  LaunchTiming timing;
  timing.instructions = static_cast<int64_t>(n);
  size_t count = 0;
  double end = 0.0;
  while (!queue.empty()) {
    const auto [t, id] = queue.top();
    queue.pop();
    const Instruction& x = ins[id];
    double s = t;
    const bool on_pipe = x.pipe != kIssueBarrier;
    const size_t pipe_slot = on_pipe ? static_cast<size_t>(x.core) * kNumPipes + x.pipe : 0;
    if (on_pipe && (x.kind == OpKind::kSetFlag || x.kind == OpKind::kCrossCoreSet)) {
      s = std::max(s, pipe_done[pipe_slot]);  // fires after the pipe's earlier work completes
    }
    double f = s + static_cast<double>(x.cycles);
    double latency = static_cast<double>(x.latency);
    if (x.kind == OpKind::kGmRead) {
      const L2CacheModel::Outcome l2_outcome =
          l2.Access({x.gm_addr, x.gm_rows, x.gm_row_bytes, x.gm_stride});
      const int64_t fetched = l2_outcome.fetched_bytes;
      f = std::max({f, l2_port.Serve(s, x.gm_bytes), hbm_port.Serve(s, fetched)});
      if (fetched > 0) latency += static_cast<double>(profile.hbm_miss_extra_cycles);
      timing.gm_read_bytes += x.gm_bytes;
      timing.hbm_read_bytes += fetched;
    } else if (x.kind == OpKind::kGmWrite) {
      l2.Access({x.gm_addr, x.gm_rows, x.gm_row_bytes, x.gm_stride});
      f = std::max(f, l2_port.Serve(s, x.gm_bytes));
      timing.gm_write_bytes += x.gm_bytes;
    }
    start[id] = s;
    finish[id] = f;
    done[id] = f + latency;
    processed[id] = 1;
    ++count;
    end = std::max(end, done[id]);
    if (on_pipe) {
      pipe_done[pipe_slot] = std::max(pipe_done[pipe_slot], done[id]);
      auto& busy = x.vector_core ? timing.vector_busy : timing.cube_busy;
      busy[x.pipe] += static_cast<int64_t>(std::llround(f - s));
    }
    for (uint32_t e = offsets[id]; e < offsets[id + 1]; ++e) {
      const uint32_t to = edges[e].to;
      ready[to] = std::max(ready[to], edges[e].after_completion ? done[id] : finish[id]);
      if (--pending[to] == 0) queue.emplace(ready[to], to);
    }
  }

  if (count != n) {
    for (uint32_t i = 0; i < n; ++i) {
      if (!processed[i] && (ins[i].kind == OpKind::kWaitFlag || ins[i].kind == OpKind::kCrossCoreWait)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "deadlock: ", n - count, " instructions can never issue; e.g. ", program.Describe(i),
            " waits on a flag that is only set after it (a cycle in the flag protocol)"));
      }
    }
    return absl::FailedPreconditionError(
        absl::StrCat("deadlock: ", n - count, " instructions can never issue"));
  }

  // A2/A3 allow one outstanding set per (pipe pair, event): the next set of a flag must not
  // fire before the previous one has been consumed.
  for (const auto& pairs : program.flag_pairs()) {
    for (size_t k = 0; k + 1 < pairs.size(); ++k) {
      const uint32_t wait = pairs[k].second, next_set = pairs[k + 1].first;
      if (done[next_set] < start[wait]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "flag protocol: ", program.Describe(next_set), " fires while the previous set is "
            "still outstanding (not yet consumed by ", program.Describe(wait), ")"));
      }
    }
  }

  for (const auto& pairs : program.cross_pairs()) {
    for (size_t k = 0; k + kMaxOutstandingCrossCoreSets < pairs.size(); ++k) {
      const uint32_t wait = pairs[k].second;
      const uint32_t set = pairs[k + kMaxOutstandingCrossCoreSets].first;
      if (done[set] < start[wait]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "flag protocol: ", program.Describe(set), " would be the 17th outstanding set of its "
            "cross-core counter"));
      }
    }
  }

  timing.total_cycles =
      static_cast<int64_t>(std::ceil(end)) + profile.launch_overhead_cycles;
  return timing;
}

}  // namespace mlaserve::npu
