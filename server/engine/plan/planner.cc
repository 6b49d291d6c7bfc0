#include "server/engine/plan/planner.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

namespace mlaserve::engine {

double TyphoonBatchThreshold(const ModelConfig& model, int sq, const DeviceRates& rates,
                             KvDtype kv_dtype) {
  const double naive_width = model.dqk() + model.dv;
  const double content_cost = kv_dtype == KvDtype::kFp8 && rates.fp8_matrix_flops > 0
                                  ? rates.matrix_flops / rates.fp8_matrix_flops
                                  : 1.0;
  const double absorb_width = sq * (2.0 * model.dl * content_cost + model.dr);
  if (!(rates.naive_matrix_flops > 0)) {
    return naive_width / absorb_width * rates.matrix_flops / rates.memory_bytes_per_second;
  }
  const double gain =
      absorb_width / rates.matrix_flops - sq * naive_width / rates.naive_matrix_flops;
  if (!(gain > 0)) return std::numeric_limits<double>::infinity();
  return naive_width / rates.memory_bytes_per_second / gain;
}

Planner::Planner(const ModelConfig& model, DeviceRates rates, int max_sq, PlannerOptions options)
    : options_(options) {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  for (int sq = 1; sq <= max_sq; ++sq) {
    b_theta_.push_back(options.hybrid ? TyphoonBatchThreshold(model, sq, rates) : kNever);
    b_theta_fp8_.push_back(options.hybrid ? TyphoonBatchThreshold(model, sq, rates, KvDtype::kFp8)
                                          : kNever);
  }
}

namespace {

// The query tokens a group contributes to each pass it takes.
int QueryTokens(const GroupPlan& group) {
  return static_cast<int>(group.members.size()) * group.sq;
}

}  // namespace

Planner::Result Planner::Plan(KvStore& store, const std::vector<const DecodeQuery*>& queries,
                              bool batch_invariant) const {
  Result result;
  BatchPlan& plan = result.plan;
  plan.queries.resize(queries.size());

  // One snapshot per layer. If a sequence vanished since validation, snapshot the layer's
  // queries one by one so only the affected ones fail.
  std::map<int, std::vector<int>> by_layer;
  for (int i = 0; i < static_cast<int>(queries.size()); ++i)
    by_layer[queries[i]->layer].push_back(i);
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

  // Group: (layer, deepest prefix, sq, space, format), in order of first appearance.
  using Key = std::tuple<int, PrefixKey, int, QuerySpace, KvDtype>;
  std::map<Key, int> group_of;
  std::vector<const std::vector<PrefixSpan>*> chains;  // per group: its prefix levels, root first
  for (int i = 0; i < static_cast<int>(queries.size()); ++i) {
    if (!usable[i]) continue;
    const DecodeQuery& q = *queries[i];
    const SequenceSnapshot& seq = plan.sequence(plan.queries[i]);
    const PrefixKey prefix = seq.prefixes.empty() ? 0 : seq.prefixes.back().key;
    const Key key{q.layer, prefix, q.sq, q.space, seq.kv_dtype};
    auto [it, inserted] = group_of.try_emplace(key, static_cast<int>(plan.groups.size()));
    if (inserted) {
      GroupPlan group;
      group.layer = q.layer;
      group.sq = q.sq;
      group.space = q.space;
      group.prefix_id = seq.prefixes.empty() ? "" : seq.prefixes.back().id;
      group.kv_dtype = seq.kv_dtype;
      // Batch-invariant: no threshold, since a group's size is the batch's doing.
      group.b_theta =
          batch_invariant ? std::numeric_limits<double>::infinity() : BTheta(q.sq, seq.kv_dtype);
      plan.groups.push_back(std::move(group));
      chains.push_back(&seq.prefixes);
    }
    GroupPlan& group = plan.groups[it->second];
    group.members.push_back(i);
    if (q.output != ElementType::kBf16) group.output = ElementType::kFp32;
  }

  // The query tokens that would read each (layer, level): with tree-aware grouping every
  // head-space group whose chain holds the level counts.
  std::map<std::pair<int, PrefixKey>, int> readers;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const GroupPlan& group = plan.groups[g];
    if (group.space != QuerySpace::kHead) continue;
    for (const PrefixSpan& level : *chains[g])
      readers[{group.layer, level.key}] += QueryTokens(group);
  }
  std::map<std::pair<int, PrefixKey>, int> pass_of;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    GroupPlan& group = plan.groups[g];
    if (batch_invariant || group.space != QuerySpace::kHead || chains[g]->empty()) continue;
    if (!options_.tree_aware && static_cast<double>(group.members.size()) < group.b_theta) continue;
    for (const PrefixSpan& level : *chains[g]) {
      const std::pair<int, PrefixKey> key{group.layer, level.key};
      // Counts only grow towards the root, so the levels that clear the bar are a prefix of
      // the chain: naive up to some depth, absorb after it.
      if (options_.tree_aware && readers[key] < BTheta(1, group.kv_dtype)) break;
      auto it = options_.tree_aware ? pass_of.find(key) : pass_of.end();
      if (it == pass_of.end()) {
        plan.passes.push_back(NaivePassPlan{level, group.layer, {}, 0, std::nullopt});
        it = pass_of.insert_or_assign(key, static_cast<int>(plan.passes.size()) - 1).first;
      }
      NaivePassPlan& pass = plan.passes[it->second];
      pass.groups.push_back(static_cast<int>(g));
      pass.query_tokens += QueryTokens(group);
      group.naive_passes.push_back(it->second);
      group.absorb_from = level.end;
      group.formulation = Formulation::kHybrid;
    }
  }
  return result;
}

void Planner::PrepareExpansions(BatchPlan& plan, KvStore& store,
                                const ModelWeights& weights) const {
  // A pass comes after the passes of its ancestor levels (Plan creates them root first), so
  // one walk in order knows, before building a pass, whether any of its groups still needs
  // it: a group whose shallower pass was dropped reads every deeper level in absorb form.
  std::vector<char> dropped(plan.passes.size(), 0);
  std::vector<char> cut(plan.groups.size(), 0);
  for (size_t p = 0; p < plan.passes.size(); ++p) {
    NaivePassPlan& pass = plan.passes[p];
    if (std::all_of(pass.groups.begin(), pass.groups.end(), [&](int g) { return cut[g] != 0; })) {
      dropped[p] = 1;
      continue;
    }
    absl::StatusOr<ExpandedKv> expanded =
        store.GetOrBuildExpanded(pass.level.key, pass.layer, weights);
    if (expanded.ok()) {
      pass.expanded.emplace(*std::move(expanded));
    } else {
      dropped[p] = 1;  // does not fit, or the prefix vanished: absorb form is always correct
      for (int g : pass.groups) cut[g] = 1;
    }
  }
  if (std::none_of(dropped.begin(), dropped.end(), [](char d) { return d != 0; })) return;
  for (NaivePassPlan& pass : plan.passes) {
    pass.groups.clear();
    pass.query_tokens = 0;
  }
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    GroupPlan& group = plan.groups[g];
    const auto first_dropped = std::find_if(group.naive_passes.begin(), group.naive_passes.end(),
                                            [&](int p) { return dropped[p] != 0; });
    group.naive_passes.erase(first_dropped, group.naive_passes.end());
    group.formulation = group.naive_passes.empty() ? Formulation::kAbsorb : Formulation::kHybrid;
    group.absorb_from =
        group.naive_passes.empty() ? 0 : plan.passes[group.naive_passes.back()].level.end;
    for (int p : group.naive_passes) {
      plan.passes[p].groups.push_back(static_cast<int>(g));
      plan.passes[p].query_tokens += QueryTokens(group);
    }
  }
  for (NaivePassPlan& pass : plan.passes) {
    if (pass.groups.empty()) pass.expanded.reset();  // unpinned: evictable again
  }
}

}  // namespace mlaserve::engine
