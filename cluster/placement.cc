#include "cluster/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"

namespace mlaserve::cluster {
namespace {

bool Excluded(const PlacementRequest& request, const std::string& id) {
  return std::find(request.exclude.begin(), request.exclude.end(), id) != request.exclude.end();
}

// The order among otherwise equal servers: the smallest instance id, or with a tie-break
// seed, an order of the client's own (FNV-1a of the id from the seed), so clients that start
// together do not all choose the same server.
uint64_t TieKey(const PlacementRequest& request, const std::string& instance_id) {
  uint64_t h = 14695981039346656037ull ^ request.tie_break;
  for (unsigned char c : instance_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool TieBefore(const PlacementRequest& request, const PlacementCandidate& a,
               const PlacementCandidate& b) {
  if (request.tie_break == 0) return a.member.instance_id < b.member.instance_id;
  return TieKey(request, a.member.instance_id) < TieKey(request, b.member.instance_id);
}

// Free bytes within this share of the roomiest count as as roomy (then fewer sequences and the
// tie order decide): a few bytes more should not pull every new sequence to one server.
constexpr int64_t kRoomyShare = 20;  // 5 %

// The holder with the smallest group, then the roomiest, then the tie order.
const PlacementCandidate* BestHolder(std::span<const PlacementCandidate> candidates,
                                     const PlacementRequest& request, bool within_spread) {
  std::vector<const PlacementCandidate*> eligible;
  for (const PlacementCandidate& c : candidates) {
    if (c.prefix_group < 0 || Excluded(request, c.member.instance_id)) continue;
    if (c.free_bytes() < request.sequence_bytes) continue;
    if (within_spread && request.spread_group > 0 && c.prefix_group >= request.spread_group) {
      continue;
    }
    eligible.push_back(&c);
  }
  if (eligible.empty()) return nullptr;
  int smallest = eligible.front()->prefix_group;
  for (const PlacementCandidate* c : eligible) smallest = std::min(smallest, c->prefix_group);
  std::erase_if(eligible, [&](const PlacementCandidate* c) { return c->prefix_group != smallest; });
  int64_t most_free = 0;
  for (const PlacementCandidate* c : eligible) most_free = std::max(most_free, c->free_bytes());
  const PlacementCandidate* best = nullptr;
  for (const PlacementCandidate* c : eligible) {
    if (c->free_bytes() < most_free - most_free / kRoomyShare) continue;
    if (best == nullptr || TieBefore(request, *c, *best)) best = c;
  }
  return best;
}

// The roomiest server that has room for the sequence and, where it lacks the prefix, the
// prefix; then the fewest sequences, then the tie order.
const PlacementCandidate* MostRoom(std::span<const PlacementCandidate> candidates,
                                   const PlacementRequest& request) {
  std::vector<const PlacementCandidate*> eligible;
  int64_t most_free = 0;
  for (const PlacementCandidate& c : candidates) {
    if (Excluded(request, c.member.instance_id)) continue;
    // Step 1 already passed over the holders; here a holder counts as any other server.
    const int64_t needed = request.sequence_bytes +
                           (request.has_prefix && c.prefix_group < 0 ? request.prefix_bytes : 0);
    if (c.free_bytes() < needed) continue;
    if (request.has_prefix && c.prefix_group >= 0 && request.spread_group > 0 &&
        c.prefix_group >= request.spread_group) {
      continue;
    }
    eligible.push_back(&c);
    most_free = std::max(most_free, c.free_bytes());
  }
  const PlacementCandidate* best = nullptr;
  for (const PlacementCandidate* c : eligible) {
    if (c->free_bytes() < most_free - most_free / kRoomyShare) continue;
    if (best == nullptr || c->sequences() < best->sequences() ||
        (c->sequences() == best->sequences() && TieBefore(request, *c, *best))) {
      best = c;
    }
  }
  return best;
}

// Rendezvous hashing's score of `instance_id` for `group` (FNV-1a over both): the servers in
// descending score are the group's order.
uint64_t RendezvousScore(const std::string& group, const std::string& instance_id) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  };
  for (unsigned char c : group) mix(c);
  mix(0);
  for (unsigned char c : instance_id) mix(c);
  // FNV's low bits mix poorly for keys that differ only at the end: finish as splitmix64.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

absl::Status NoRoom(std::span<const PlacementCandidate> candidates,
                    const PlacementRequest& request) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "no server of the cluster has room for a new sequence: it needs ", request.sequence_bytes,
      " bytes",
      request.has_prefix
          ? absl::StrCat(" (", request.prefix_bytes, " more where its prefix is not registered)")
          : "",
      ", among ", candidates.size(), " members",
      request.exclude.empty() ? "" : absl::StrCat(" (", request.exclude.size(), " excluded)")));
}

}  // namespace

int64_t LoadBound(int64_t total, int64_t members, double slack) {
  return static_cast<int64_t>(std::ceil((1.0 + std::max(0.0, slack)) * static_cast<double>(total) /
                                            static_cast<double>(std::max<int64_t>(1, members)) -
                                        1e-9));
}

absl::StatusOr<Placement> PlaceGroup(std::span<const PlacementCandidate> candidates,
                                     const PlacementRequest& request, const GroupRequest& group) {
  std::vector<const PlacementCandidate*> members;
  int64_t total_load = 0;
  int64_t total_bytes = 0;
  for (const PlacementCandidate& c : candidates) {
    if (Excluded(request, c.member.instance_id)) continue;
    members.push_back(&c);
    total_load += c.group_load;
    total_bytes += c.group_bytes;
  }
  const int64_t n = static_cast<int64_t>(members.size());
  std::vector<const PlacementCandidate*> roomy;
  for (const PlacementCandidate* c : members) {
    const int64_t needed = request.sequence_bytes +
                           (request.has_prefix && c->prefix_group < 0 ? request.prefix_bytes : 0);
    if (c->free_bytes() >= needed) roomy.push_back(c);
  }
  if (roomy.empty()) return NoRoom(candidates, request);
  const int64_t load_cap = LoadBound(total_load + group.weight, n, group.load_slack);
  const int64_t bytes_cap = LoadBound(total_bytes + group.bytes, n, group.load_slack);
  auto within = [&](const PlacementCandidate* c) {
    return c->group_load + group.weight <= load_cap && c->group_bytes + group.bytes <= bytes_cap;
  };
  // Holders of the prefix first (its expanded K/V is already there), then the group's order.
  std::sort(roomy.begin(), roomy.end(),
            [&](const PlacementCandidate* a, const PlacementCandidate* b) {
              const bool a_holds = request.has_prefix && a->prefix_group >= 0;
              const bool b_holds = request.has_prefix && b->prefix_group >= 0;
              if (a_holds != b_holds) return a_holds;
              return RendezvousScore(group.group, a->member.instance_id) >
                     RendezvousScore(group.group, b->member.instance_id);
            });
  const PlacementCandidate* chosen = nullptr;
  for (const PlacementCandidate* c : roomy) {
    if (within(c)) {
      chosen = c;
      break;
    }
  }
  if (chosen == nullptr) {  // the group is too large for the bound anywhere: the least loaded
    for (const PlacementCandidate* c : roomy) {
      if (chosen == nullptr || c->group_load < chosen->group_load ||
          (c->group_load == chosen->group_load && c->group_bytes < chosen->group_bytes)) {
        chosen = c;
      }
    }
  }
  return Placement{chosen->member.instance_id, request.has_prefix && chosen->prefix_group < 0};
}

absl::StatusOr<Placement> PlaceSequence(std::span<const PlacementCandidate> candidates,
                                        const PlacementRequest& request) {
  if (request.has_prefix) {
    if (const PlacementCandidate* holder = BestHolder(candidates, request, true)) {
      return Placement{holder->member.instance_id, false};
    }
  }
  if (const PlacementCandidate* roomy = MostRoom(candidates, request)) {
    return Placement{roomy->member.instance_id, request.has_prefix && roomy->prefix_group < 0};
  }
  if (request.has_prefix) {
    if (const PlacementCandidate* holder = BestHolder(candidates, request, false)) {
      return Placement{holder->member.instance_id, false};
    }
  }
  return NoRoom(candidates, request);
}

}  // namespace mlaserve::cluster
