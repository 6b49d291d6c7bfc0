#include "server/engine/kv/eviction.h"

#include <functional>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace mlaserve::engine {

std::optional<EvictionPlan> PlanEviction(const PrefixTree& tree, const ExpandedKvCache& expanded,
                                         const PageAllocator& pages, int64_t page_bytes, int layers,
                                         int64_t bytes) {
  struct Candidate {
    uint64_t last_use;
    PrefixNode* node;
    int layer;  // < 0: the whole prefix
    bool operator>(const Candidate& o) const { return last_use > o.last_use; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> candidates;
  for (const auto& [key, node] : tree.nodes()) {
    if (node->ready && node->registered && node->references == 0)
      candidates.push({node->last_use, node.get(), -1});
  }
  expanded.ForEachReady([&](PrefixKey key, int layer, const ExpandedKvCache::Entry& entry) {
    if (entry.pins == 0) candidates.push({entry.last_use, tree.nodes().at(key).get(), layer});
  });
  // Bytes a ready expansion gives back.
  auto expansion_bytes = [&](const PrefixNode* node, int layer) -> int64_t {
    const ExpandedKvCache::Entry* entry = expanded.Find(node->key, layer);
    return entry != nullptr && entry->ready ? entry->bytes : 0;
  };

  EvictionPlan plan;
  int64_t freed = 0;
  absl::flat_hash_map<int32_t, int32_t> dropped_owners;
  absl::flat_hash_map<const PrefixNode*, int64_t> dropped_references;
  absl::flat_hash_set<const PrefixNode*> freed_nodes;
  absl::flat_hash_set<std::pair<const PrefixNode*, int>> freed_slots;
  const auto free_node = [&](const PrefixNode* node) {
    freed_nodes.insert(node);
    for (const std::vector<int32_t>& layer_pages : node->pages) {
      for (int32_t page : layer_pages) {
        if (pages.owners(page) - ++dropped_owners[page] == 0 && pages.pins(page) == 0)
          freed += page_bytes;
      }
    }
    for (int layer = 0; layer < layers; ++layer) {
      if (!freed_slots.contains({node, layer})) freed += expansion_bytes(node, layer);
    }
  };
  while (freed < bytes && !candidates.empty()) {
    const Candidate c = candidates.top();
    candidates.pop();
    if (c.layer >= 0) {
      if (freed_nodes.contains(c.node)) continue;
      freed_slots.insert({c.node, c.layer});
      freed += expansion_bytes(c.node, c.layer);
      plan.victims.push_back({c.node, c.layer});
      continue;
    }
    plan.victims.push_back({c.node, -1});
    free_node(c.node);
    for (PrefixNode* p = c.node->parent; p != nullptr; p = p->parent) {
      if (p->references - ++dropped_references[p] > 0) break;
      if (p->registered) {
        candidates.push({p->last_use, p, -1});
        break;
      }
      free_node(p);
    }
  }
  if (freed < bytes) return std::nullopt;
  return plan;
}

}  // namespace mlaserve::engine
