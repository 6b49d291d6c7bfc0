#include "cluster/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mlaserve::cluster {
namespace {

bool Excluded(const PlacementRequest& request, const std::string& id) {
  return std::find(request.exclude.begin(), request.exclude.end(), id) != request.exclude.end();
}

// The holder with the smallest group, then the most free bytes, then the smallest id.
const PlacementCandidate* BestHolder(std::span<const PlacementCandidate> candidates,
                                     const PlacementRequest& request, bool within_spread) {
  const PlacementCandidate* best = nullptr;
  for (const PlacementCandidate& c : candidates) {
    if (c.prefix_group < 0 || Excluded(request, c.member.instance_id)) continue;
    if (c.free_bytes() < request.sequence_bytes) continue;
    if (within_spread && request.spread_group > 0 && c.prefix_group >= request.spread_group) {
      continue;
    }
    if (best == nullptr || c.prefix_group < best->prefix_group ||
        (c.prefix_group == best->prefix_group &&
         (c.free_bytes() > best->free_bytes() ||
          (c.free_bytes() == best->free_bytes() &&
           c.member.instance_id < best->member.instance_id)))) {
      best = &c;
    }
  }
  return best;
}

// The server with the most free bytes that has room for the sequence and, where it lacks
// the prefix, the prefix.
const PlacementCandidate* MostRoom(std::span<const PlacementCandidate> candidates,
                                   const PlacementRequest& request) {
  const PlacementCandidate* best = nullptr;
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
    if (best == nullptr || c.free_bytes() > best->free_bytes() ||
        (c.free_bytes() == best->free_bytes() &&
         (c.member.sequences < best->member.sequences ||
          (c.member.sequences == best->member.sequences &&
           c.member.instance_id < best->member.instance_id)))) {
      best = &c;
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
