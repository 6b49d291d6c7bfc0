#include "server/engine/plan/planner.h"

#include <map>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace mlaserve::engine {

double TyphoonBatchThreshold(const ModelConfig& model, int sq, const DeviceRates& rates) {
  const double naive_width = model.dqk() + model.dv;
  const double absorb_width = sq * (2.0 * model.dl + model.dr);
  return naive_width / absorb_width * rates.matrix_flops / rates.memory_bytes_per_second;
}

Planner::Planner(const ModelConfig& model, DeviceRates rates, int max_sq) : model_(model) {
  for (int sq = 1; sq <= max_sq; ++sq) b_theta_.push_back(TyphoonBatchThreshold(model, sq, rates));
}

Planner::Result Planner::Plan(KvStore& store, const ModelWeights& weights,
                              const std::vector<const DecodeQuery*>& queries) const {
  Result result;
  BatchPlan& plan = result.plan;
  plan.queries.resize(queries.size());

  // One snapshot per layer. If a sequence vanished since validation, snapshot the layer's
  // queries one by one so only the affected ones fail.
  std::map<int, std::vector<int>> by_layer;
  for (int i = 0; i < static_cast<int>(queries.size()); ++i) by_layer[queries[i]->layer].push_back(i);
  std::vector<char> usable(queries.size(), 0);
  for (const auto& [layer, members] : by_layer) {
    std::vector<std::string> ids;
    for (int i : members) ids.push_back(queries[i]->sequence_id);
    absl::StatusOr<KvSnapshot> snapshot = store.Snapshot(ids, layer);
    if (snapshot.ok()) {
      const int index = static_cast<int>(plan.snapshots.size());
      plan.snapshots.push_back(*std::move(snapshot));
      for (int k = 0; k < static_cast<int>(members.size()); ++k) {
        plan.queries[members[k]] = PlannedQuery{queries[members[k]], index, k};
        usable[members[k]] = 1;
      }
      continue;
    }
    for (int i : members) {
      absl::StatusOr<KvSnapshot> single = store.Snapshot(queries[i]->sequence_id, layer);
      if (!single.ok()) {
        result.failed.emplace_back(i, single.status());
        continue;
      }
      plan.queries[i] = PlannedQuery{queries[i], static_cast<int>(plan.snapshots.size()), 0};
      plan.snapshots.push_back(*std::move(single));
      usable[i] = 1;
    }
  }

  // Group: (layer, deepest prefix, sq, space), in order of first appearance.
  using Key = std::tuple<int, PrefixKey, int, QuerySpace>;
  std::map<Key, int> group_of;
  for (int i = 0; i < static_cast<int>(queries.size()); ++i) {
    if (!usable[i]) continue;
    const DecodeQuery& q = *queries[i];
    const SequenceSnapshot& seq = plan.sequence(plan.queries[i]);
    const PrefixKey prefix = seq.prefixes.empty() ? 0 : seq.prefixes.back().key;
    const Key key{q.layer, prefix, q.sq, q.space};
    auto [it, inserted] = group_of.try_emplace(key, static_cast<int>(plan.groups.size()));
    if (inserted) {
      GroupPlan group;
      group.layer = q.layer;
      group.sq = q.sq;
      group.space = q.space;
      group.prefix_id = seq.prefixes.empty() ? "" : seq.prefixes.back().id;
      group.b_theta = BTheta(q.sq);
      plan.groups.push_back(std::move(group));
    }
    plan.groups[it->second].members.push_back(i);
  }

  for (GroupPlan& group : plan.groups) {
    if (group.space != QuerySpace::kHead || group.prefix_id.empty() ||
        static_cast<double>(group.members.size()) < group.b_theta) {
      continue;  // absorb-only
    }
    const SequenceSnapshot& first = plan.sequence(plan.queries[group.members.front()]);
    std::vector<ExpandedKv> levels;
    bool fits = true;
    for (const PrefixSpan& level : first.prefixes) {
      absl::StatusOr<ExpandedKv> expanded = store.GetOrBuildExpanded(level.key, group.layer, weights);
      if (!expanded.ok()) {  // does not fit (or vanished): absorb-only is always correct
        fits = false;
        break;
      }
      levels.push_back(*std::move(expanded));
    }
    if (!fits) continue;
    group.formulation = Formulation::kHybrid;
    group.levels = std::move(levels);
    group.prefix_tokens = first.prefix_tokens();
  }
  return result;
}

}  // namespace mlaserve::engine
