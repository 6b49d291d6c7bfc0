#ifndef MLASERVE_SERVER_ENGINE_PLAN_BATCH_PLAN_H_
#define MLASERVE_SERVER_ENGINE_PLAN_BATCH_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/engine/engine_types.h"
#include "server/engine/kv/expanded_kv.h"
#include "server/engine/kv/kv_snapshot.h"

namespace mlaserve::engine {

// A device batch, planned: what every query reads (pinned snapshots), how queries group, and
// which formulation each group runs. Devices execute it; it holds no device specifics.

// One query of the batch, resolved against the snapshot of its layer.
struct PlannedQuery {
  const DecodeQuery* query = nullptr;
  int snapshot = 0;  // index into BatchPlan::snapshots
  int sequence = 0;  // the query's sequence within that snapshot
};

// Queries that attend the same way: same layer, same shared prefix, same sq, same q space.
// Row order inside a group: member-major, then query token, then head.
struct GroupPlan {
  Formulation formulation = Formulation::kAbsorb;
  int layer = 0;
  int sq = 1;
  QuerySpace space = QuerySpace::kHead;
  std::vector<int> members;  // indices into BatchPlan::queries
  std::string prefix_id;     // the deepest shared prefix, "" if none
  double b_theta = 0;
  // kHybrid only: the expanded K/V of every prefix level, root first (pinned while the plan
  // lives), and the token where the suffix begins (the end of the deepest level).
  std::vector<ExpandedKv> levels;
  int32_t prefix_tokens = 0;

  // Where the absorb part starts reading each member's keys.
  int32_t AbsorbFrom() const { return formulation == Formulation::kHybrid ? prefix_tokens : 0; }
};

struct BatchPlan {
  std::vector<KvSnapshot> snapshots;  // one per layer the batch touches
  std::vector<PlannedQuery> queries;  // in batch order
  std::vector<GroupPlan> groups;

  const SequenceSnapshot& sequence(const PlannedQuery& q) const {
    return snapshots[q.snapshot].sequence(q.sequence);
  }
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_PLAN_BATCH_PLAN_H_
