#ifndef MLASERVE_CLUSTER_PLACEMENT_H_
#define MLASERVE_CLUSTER_PLACEMENT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/member_record.h"

namespace mlaserve::cluster {

// A server placement may choose, as one client knows it.
struct PlacementCandidate {
  MemberRecord member;
  // Bytes this client placed there since the member's record was written (the record's load
  // lags by up to its refresh interval; without this a burst would all land on one server).
  int64_t reserved_bytes = 0;
  // Sequences this client placed there since then, likewise.
  int reserved_sequences = 0;
  // Live sequences on the new sequence's prefix that this client placed there; -1 when the
  // prefix is not registered there.
  int prefix_group = -1;

  // What every client's placement groups there are expected to bring (GroupTable's claims,
  // the group being placed excluded): queries per step and KV bytes. Exact where the record's
  // load lags: a claim is written before its first sequence is created.
  int64_t group_load = 0;
  int64_t group_bytes = 0;

  int sequences() const { return member.sequences + reserved_sequences; }
  int64_t free_bytes() const {
    return member.kv_budget_bytes - member.kv_used_bytes - reserved_bytes;
  }
};

struct PlacementRequest {
  // Room the new sequence is expected to take (its expected tokens' KV).
  int64_t sequence_bytes = 0;
  // Room registering the prefix takes where it is not yet (latent plus expanded K/V); 0
  // without a prefix.
  int64_t prefix_bytes = 0;
  bool has_prefix = false;
  // A prefix's group on one server beyond which its new sequences go to another server (the
  // prefix registered there too), as long as one has room; 0: never spread while a holder
  // has room. About twice TyphoonMLA's B_theta keeps a group hybrid while sequences come and go.
  int spread_group = 0;
  // Instance ids not to choose (a context-parallel sequence's other parts).
  std::vector<std::string> exclude;
  // Orders servers that are otherwise equal: 0, the smallest instance id; else an order of
  // this seed (each client its own), so clients that start together spread out.
  uint64_t tie_break = 0;
};

// A placement group: sequences decoded together (a serving framework's rank on one prompt),
// kept whole on one server so that its calls stay one batch there (TyphoonMLA's hybrid needs
// B_theta of them in one batch).
struct GroupRequest {
  // The group's name as every client sees it (GroupTable's key): it orders the servers
  // (rendezvous hashing), so one group's order is the same for every client and for the same
  // group again after a restart, while different groups spread.
  std::string group;
  // Queries per step the group is expected to bring (at least B_theta for a prefix group:
  // it is placed to become hybrid) and the KV bytes it is expected to hold.
  int64_t weight = 1;
  int64_t bytes = 0;
  // No server holds more than (1 + load_slack) of the mean once the group is on it (rounded
  // up to whole queries); a group too large for that anywhere goes to the least loaded.
  double load_slack = 0.15;
};

struct Placement {
  std::string instance_id;
  bool register_prefix = false;  // the prefix must be registered there first
};

// Where a new sequence goes (docs/cluster.md, "Placement"):
//  1. a server holding its prefix, with room, whose group is below spread_group: the one
//     with the smallest group, then the roomiest;
//  2. else the roomiest server that has room for the sequence and the prefix, then the one
//     with the fewest sequences, registering the prefix there;
//  3. else a holder of the prefix with room, whatever its group (the smallest group first):
//     affinity beats spreading when no other server has room.
// "The roomiest": free bytes within 5 % of the most free count the same; remaining ties go
// by `tie_break`'s order.
// RESOURCE_EXHAUSTED naming the bytes needed when no candidate has room.
absl::StatusOr<Placement> PlaceSequence(std::span<const PlacementCandidate> candidates,
                                        const PlacementRequest& request);

// The most any of `members` servers may hold once `total` (every server's load, the group's
// included) is spread: ceil((1 + slack) x total / members). PlaceGroup's bound, and the one
// rebalancing keeps a group's server within.
int64_t LoadBound(int64_t total, int64_t members, double slack);

// Where a new placement group goes: bounded-load rendezvous hashing (docs/cluster.md,
// "Placement groups"). Among servers with room for its first sequence (and the prefix where
// it is not registered), those within the load bound on both queries and bytes, holders of
// the prefix first, then in the group's rendezvous order; when none is within the bound
// (the group is large against the mean: the first groups, or one larger than the rest), the
// least loaded, ties in the same order. `request.spread_group` is not used: a group is one
// server's. RESOURCE_EXHAUSTED as PlaceSequence's.
absl::StatusOr<Placement> PlaceGroup(std::span<const PlacementCandidate> candidates,
                                     const PlacementRequest& request, const GroupRequest& group);

}  // namespace mlaserve::cluster

#endif  // MLASERVE_CLUSTER_PLACEMENT_H_
