#ifndef MLASERVE_SERVER_ENGINE_PLAN_BATCH_PLAN_H_
#define MLASERVE_SERVER_ENGINE_PLAN_BATCH_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/core/element_type.h"
#include "server/engine/engine_types.h"
#include "server/engine/kv/expanded_kv.h"
#include "server/engine/kv/kv_snapshot.h"

namespace mlaserve::engine {

// A device batch, planned: what every query reads (pinned snapshots), how queries group,
// which formulation each group runs and which naive-form passes over shared prefixes the
// batch makes. It holds no device specifics; ToDecodeBatch (decode_batch_lowering.h) turns
// it into the kernels' terms.

// One query of the batch, resolved against the snapshot of its layer.
struct PlannedQuery {
  const DecodeQuery* query = nullptr;
  int snapshot = 0;  // index into BatchPlan::snapshots
  int sequence = 0;  // the query's sequence within that snapshot
};

// A naive-form pass over one prefix level of one layer: the level's expanded K/V read once
// for the query rows of every group listed (TyphoonMLA's shared part). With tree-aware
// grouping the groups on a prefix and on its children share the passes over the levels they
// have in common; with flat grouping each group has its own.
struct NaivePassPlan {
  PrefixSpan level;
  int layer = 0;
  std::vector<int> groups;  // indices into BatchPlan::groups, in row order
  int query_tokens = 0;     // members x sq summed over those groups: the B against B_theta(1)
  // The level's expansion, pinned while the plan lives; built on the device's thread
  // (Planner::PrepareExpansions), not on the batcher's.
  std::optional<ExpandedKv> expanded;
};

// Queries that attend the same way: same layer, same shared prefix, same sq, same q space.
// Row order inside a group: member-major, then query token, then head.
struct GroupPlan {
  Formulation formulation = Formulation::kAbsorb;
  int layer = 0;
  int sq = 1;
  QuerySpace space = QuerySpace::kHead;
  std::vector<int> members;           // indices into BatchPlan::queries
  std::string prefix_id;              // the deepest shared prefix, "" if none
  KvDtype kv_dtype = KvDtype::kBf16;  // its sequences' (and prefix's) format
  double b_theta = 0;
  // kHybrid: the passes over its prefix levels, root first, covering keys [0, absorb_from);
  // the absorb part reads each member's keys from absorb_from on.
  std::vector<int> naive_passes;
  int32_t absorb_from = 0;
  // bf16 when every member asked for bf16, fp32 otherwise (the edge rounds those that asked).
  ElementType output = ElementType::kBf16;
};

struct BatchPlan {
  std::vector<KvSnapshot> snapshots;  // one per layer the batch touches
  std::vector<PlannedQuery> queries;  // in batch order
  std::vector<GroupPlan> groups;
  std::vector<NaivePassPlan> passes;

  const SequenceSnapshot& sequence(const PlannedQuery& q) const {
    return snapshots[q.snapshot].sequence(q.sequence);
  }
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_PLAN_BATCH_PLAN_H_
