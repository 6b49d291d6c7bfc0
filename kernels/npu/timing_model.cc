#include "kernels/npu/timing_model.h"

#include <algorithm>
#include <bit>
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

absl::StatusOr<LaunchTiming> SimulateLaunch(const Program& program, const DeviceProfile& profile,
                                            TimingScratch& scratch) {
  const std::vector<Instruction>& ins = program.instructions();
  const size_t n = ins.size();
  const auto& offsets = program.edge_offsets();
  const auto& edges = program.edges();
  const std::vector<uint32_t>& in_degree = program.in_degree();
  std::vector<TimingScratch::Node>& nodes = scratch.nodes_;
  std::vector<GmRegion>& footprints = scratch.footprints_;
  nodes.resize(n);
  footprints.clear();
  for (uint32_t i = 0; i < n; ++i) {
    const Instruction& x = ins[i];
    TimingScratch::Node& node = nodes[i];
    node.time = 0.0;
    node.cycles = static_cast<double>(x.cycles);
    node.latency = static_cast<double>(x.latency);
    node.pending = in_degree[i];
    node.first_edge = offsets[i];
    node.edges = offsets[i + 1] - offsets[i];
    node.kind = x.kind;
    node.pipe = x.pipe;
    node.pipe_slot =
        x.pipe != kIssueBarrier ? static_cast<uint32_t>(x.core) * kNumPipes + x.pipe : 0;
    node.is_set = x.kind == OpKind::kSetFlag || x.kind == OpKind::kCrossCoreSet;
    node.vector_core = x.vector_core;
    if (x.kind == OpKind::kGmRead || x.kind == OpKind::kGmWrite) {
      node.footprint = static_cast<uint32_t>(footprints.size());
      footprints.push_back({x.gm_addr, x.gm_rows, x.gm_row_bytes, x.gm_stride});
    }
  }
  // Completion of everything issued so far on each (core, pipe): what a set waits for.
  std::vector<double>& pipe_done = scratch.pipe_done_;
  pipe_done.assign(static_cast<size_t>(program.num_cores()) * kNumPipes, 0.0);

  L2CacheModel& l2 = scratch.l2_;
  l2.Reset(profile.l2_bytes, profile.l2_line_bytes);
  BandwidthServer l2_port(profile.l2_bytes_per_cycle);
  BandwidthServer hbm_port(profile.hbm_bytes_per_cycle);

  // Pops in (ready time, id) order: ties broken by id, so the order is fully determined.
  using Key = TimingScratch::Key;
  const auto key = [](double time, uint32_t id) {
    return Key{std::bit_cast<uint64_t>(time)} << 32 | id;
  };
  std::vector<Key>& queue = scratch.queue_;
  queue.clear();
  constexpr std::greater<> kLater;
  for (uint32_t i = 0; i < n; ++i) {
    if (in_degree[i] == 0) queue.push_back(key(0.0, i));
  }
  std::make_heap(queue.begin(), queue.end(), kLater);

  constexpr uint32_t kLookahead = 16;  // instructions; see the prefetches below
  LaunchTiming timing;
  timing.instructions = static_cast<int64_t>(n);
  size_t count = 0;
  double end = 0.0;
  bool uses_cube = false, uses_vector = false;  // the kernel type, for the launch head
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), kLater);
    const double t = std::bit_cast<double>(static_cast<uint64_t>(queue.back() >> 32));
    const auto id = static_cast<uint32_t>(queue.back());
    queue.pop_back();
    // A core's instructions are numbered in its program order, and the pops advance each
    // core's stream a few instructions at a time: some hundred streams at once, too many
    // for the hardware prefetcher. Fetching a little ahead of this one cut the model's
    // time by a quarter on programs too large for the caches.
    if (id + kLookahead < n) {
      const TimingScratch::Node* ahead = &nodes[id + kLookahead];
      __builtin_prefetch(ahead);
      __builtin_prefetch(reinterpret_cast<const char*>(ahead) + sizeof(TimingScratch::Node) - 1);
      const TimingScratch::Node& nearer = nodes[id + kLookahead / 2];  // fetched before
      __builtin_prefetch(&edges[nearer.first_edge]);
      if (nearer.kind == OpKind::kGmRead || nearer.kind == OpKind::kGmWrite) {
        __builtin_prefetch(&footprints[nearer.footprint]);
      }
    }
    TimingScratch::Node& x = nodes[id];
    double s = t;
    const bool on_pipe = x.pipe != kIssueBarrier;
    if (on_pipe && x.is_set) {
      s = std::max(s, pipe_done[x.pipe_slot]);  // fires after the pipe's earlier work completes
    }
    double f = s + x.cycles;
    double latency = x.latency;
    if (x.kind == OpKind::kGmRead) {
      const GmRegion& gm = footprints[x.footprint];
      const int64_t bytes = gm.bytes();
      const int64_t fetched = l2.Access(gm).fetched_bytes;
      f = std::max({f, l2_port.Serve(s, bytes), hbm_port.Serve(s, fetched)});
      if (fetched > 0) latency += static_cast<double>(profile.hbm_miss_extra_cycles);
      timing.gm_read_bytes += bytes;
      timing.hbm_read_bytes += fetched;
    } else if (x.kind == OpKind::kGmWrite) {
      const GmRegion& gm = footprints[x.footprint];
      l2.Access(gm);
      f = std::max(f, l2_port.Serve(s, gm.bytes()));
      timing.gm_write_bytes += gm.bytes();
    }
    const double done = f + latency;
    x.time = x.is_set ? done : s;
    ++count;
    end = std::max(end, done);
    if (on_pipe) {
      pipe_done[x.pipe_slot] = std::max(pipe_done[x.pipe_slot], done);
      (x.vector_core ? uses_vector : uses_cube) = true;
      auto& busy = x.vector_core ? timing.vector_busy : timing.cube_busy;
      busy[x.pipe] += static_cast<int64_t>(std::llround(f - s));
    }
    for (uint32_t e = x.first_edge; e < x.first_edge + x.edges; ++e) {
      const uint32_t to = edges[e].to;
      TimingScratch::Node& next = nodes[to];
      next.time = std::max(next.time, edges[e].after_completion ? done : f);
      if (--next.pending == 0) {
        queue.push_back(key(next.time, to));
        std::push_heap(queue.begin(), queue.end(), kLater);
      }
    }
  }

  if (count != n) {  // Program::Finalize refuses cycles: only a bug here leaves any behind
    return absl::InternalError(absl::StrCat("timing model: ", n - count,
                                            " instructions never issued in an acyclic program"));
  }

  // A2/A3 allow one outstanding set per (pipe pair, event): the next set of a flag must not
  // fire before the previous one has been consumed.
  const FlagPairs& flags = program.flag_pairs();
  for (size_t g = 0; g < flags.groups(); ++g) {
    const std::pair<uint32_t, uint32_t>* pairs = flags.pairs.data() + flags.offsets[g];
    const size_t size = flags.offsets[g + 1] - flags.offsets[g];
    for (size_t k = 0; k + 1 < size; ++k) {
      const uint32_t wait = pairs[k].second, next_set = pairs[k + 1].first;
      if (nodes[next_set].time < nodes[wait].time) {
        return absl::FailedPreconditionError(
            absl::StrCat("flag protocol: ", program.Describe(next_set),
                         " fires while the previous set is "
                         "still outstanding (not yet consumed by ",
                         program.Describe(wait), ")"));
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
      if (nodes[set].time < nodes[wait].time) {
        return absl::FailedPreconditionError(
            absl::StrCat("flag protocol: ", program.Describe(set),
                         " would be the 17th outstanding set of its "
                         "cross-core counter"));
      }
    }
  }

  timing.head_cycles = LaunchHeadCycles(profile, program.block_dim(), uses_cube, uses_vector);
  timing.total_cycles = static_cast<int64_t>(std::ceil(end)) + timing.head_cycles;
  return timing;
}

int64_t LaunchHeadCycles(const DeviceProfile& profile, int block_dim, bool uses_cube,
                         bool uses_vector) {
  const int64_t blocks_per_die = (block_dim + profile.dies - 1) / profile.dies;
  int64_t head = 0;
  if (uses_cube && uses_vector) {
    head = profile.launch_overhead_cycles + profile.mix_block_start_cycles * blocks_per_die;
  } else if (uses_cube) {
    head = profile.launch_overhead_cycles + profile.cube_block_start_cycles * blocks_per_die;
  } else {
    head = profile.vector_launch_overhead_cycles +
           profile.vector_block_start_cycles * blocks_per_die * profile.vector_cores_per_cube;
  }
  return head + profile.core_prologue_cycles;
}

}  // namespace mlaserve::npu
