#include "kernels/npu/timing_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
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
  TimingScratch scratch;
  return SimulateLaunch(program, profile, scratch);
}

absl::StatusOr<LaunchTiming> SimulateLaunch(const Program& program, const DeviceProfile& profile,
                                            TimingScratch& scratch) {
  const std::vector<Instruction>& ins = program.instructions();
  const size_t n = ins.size();
  const auto& offsets = program.edge_offsets();
  const auto& edges = program.edges();
  const std::vector<uint32_t>& in_degree = program.in_degree();
  std::vector<TimingScratch::Node>& nodes = scratch.nodes_;
  nodes.resize(n);
  for (size_t i = 0; i < n; ++i) nodes[i] = {0.0, in_degree[i]};
  std::vector<double>& marks = scratch.marks_;
  marks.resize(n);
  // Completion of everything issued so far on each (core, pipe): what a set waits for.
  std::vector<double>& pipe_done = scratch.pipe_done_;
  pipe_done.assign(static_cast<size_t>(program.num_cores()) * kNumPipes, 0.0);

  L2CacheModel l2(profile.l2_bytes, profile.l2_line_bytes);
  BandwidthServer l2_port(profile.l2_bytes_per_cycle);
  BandwidthServer hbm_port(profile.hbm_bytes_per_cycle);

  // Pops in (ready time, id) order: ties broken by id, so the order is fully determined.
  std::vector<std::pair<double, uint32_t>>& queue = scratch.queue_;
  queue.clear();
  constexpr std::greater<> kLater;
  for (uint32_t i = 0; i < n; ++i) {
    if (in_degree[i] == 0) queue.emplace_back(0.0, i);
  }
  std::make_heap(queue.begin(), queue.end(), kLater);

  constexpr uint32_t kLookahead = 16;  // instructions; see the prefetches below
  LaunchTiming timing;
  timing.instructions = static_cast<int64_t>(n);
  size_t count = 0;
  double end = 0.0;
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), kLater);
    const auto [t, id] = queue.back();
    queue.pop_back();
    // A core's instructions are numbered in its program order, and the pops advance each
    // core's stream a few instructions at a time: some hundred streams at once, too many
    // for the hardware prefetcher. Fetching a little ahead of this one cut the model's
    // time by a quarter on programs too large for the caches.
    if (id + kLookahead < n) {
      const uint32_t ahead = id + kLookahead;
      __builtin_prefetch(&ins[ahead]);
      __builtin_prefetch(reinterpret_cast<const char*>(&ins[ahead]) + sizeof(Instruction) - 1);
      __builtin_prefetch(&nodes[ahead]);
      __builtin_prefetch(&offsets[ahead]);
      __builtin_prefetch(&edges[offsets[ahead - kLookahead / 2]]);
    }
    const Instruction& x = ins[id];
    double s = t;
    const bool on_pipe = x.pipe != kIssueBarrier;
    const size_t pipe_slot = on_pipe ? static_cast<size_t>(x.core) * kNumPipes + x.pipe : 0;
    const bool is_set = x.kind == OpKind::kSetFlag || x.kind == OpKind::kCrossCoreSet;
    if (on_pipe && is_set) {
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
    const double done = f + latency;
    marks[id] = is_set ? done : s;
    ++count;
    end = std::max(end, done);
    if (on_pipe) {
      pipe_done[pipe_slot] = std::max(pipe_done[pipe_slot], done);
      auto& busy = x.vector_core ? timing.vector_busy : timing.cube_busy;
      busy[x.pipe] += static_cast<int64_t>(std::llround(f - s));
    }
    for (uint32_t e = offsets[id]; e < offsets[id + 1]; ++e) {
      const uint32_t to = edges[e].to;
      TimingScratch::Node& node = nodes[to];
      node.ready = std::max(node.ready, edges[e].after_completion ? done : f);
      if (--node.pending == 0) {
        queue.emplace_back(node.ready, to);
        std::push_heap(queue.begin(), queue.end(), kLater);
      }
    }
  }

  if (count != n) {
    for (uint32_t i = 0; i < n; ++i) {
      // Whatever was never simulated still waits for a predecessor.
      if (nodes[i].pending != 0 &&
          (ins[i].kind == OpKind::kWaitFlag || ins[i].kind == OpKind::kCrossCoreWait)) {
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
  const FlagPairs& flags = program.flag_pairs();
  for (size_t g = 0; g < flags.groups(); ++g) {
    const std::pair<uint32_t, uint32_t>* pairs = flags.pairs.data() + flags.offsets[g];
    const size_t size = flags.offsets[g + 1] - flags.offsets[g];
    for (size_t k = 0; k + 1 < size; ++k) {
      const uint32_t wait = pairs[k].second, next_set = pairs[k + 1].first;
      if (marks[next_set] < marks[wait]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "flag protocol: ", program.Describe(next_set), " fires while the previous set is "
            "still outstanding (not yet consumed by ", program.Describe(wait), ")"));
      }
    }
  }

  const FlagPairs& cross = program.cross_pairs();
  for (size_t g = 0; g < cross.groups(); ++g) {
    const std::pair<uint32_t, uint32_t>* pairs = cross.pairs.data() + cross.offsets[g];
    const size_t size = cross.offsets[g + 1] - cross.offsets[g];
    for (size_t k = 0; k + kMaxOutstandingCrossCoreSets < size; ++k) {
      const uint32_t wait = pairs[k].second;
      const uint32_t set = pairs[k + kMaxOutstandingCrossCoreSets].first;
      if (marks[set] < marks[wait]) {
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
