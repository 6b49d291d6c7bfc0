#include "cluster/placement.h"

#include <algorithm>
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

}  // namespace

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
  return absl::ResourceExhaustedError(absl::StrCat(
      "no server of the cluster has room for a new sequence: it needs ", request.sequence_bytes,
      " bytes",
      request.has_prefix
          ? absl::StrCat(" (", request.prefix_bytes, " more where its prefix is not registered)")
          : "",
      ", among ", candidates.size(), " members",
      request.exclude.empty() ? "" : absl::StrCat(" (", request.exclude.size(), " excluded)")));
}

}  // namespace mlaserve::cluster
