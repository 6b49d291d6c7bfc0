#ifndef MLASERVE_SERVER_ENGINE_KV_EVICTION_H_
#define MLASERVE_SERVER_ENGINE_KV_EVICTION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "server/engine/kv/expanded_kv_cache.h"
#include "server/engine/kv/page_allocator.h"
#include "server/engine/kv/prefix_tree.h"

namespace mlaserve::engine {

// What an eviction would remove, in order: whole prefixes (layer < 0) or one layer's
// expansion of a prefix.
struct EvictionPlan {
  struct Victim {
    PrefixNode* node;
    int layer;
  };
  std::vector<Victim> victims;
};

// The least recently used evictable items (registered prefixes nothing references, ready
// expansions no handle pins) whose removal returns at least `bytes` to the budget, simulating
// what freeing each gives back: a prefix frees the pages no one else holds and its
// expansions, and may leave its parent unreferenced (the parent then joins the candidates if
// registered, or, released, goes with it). nullopt if evicting everything evictable is not
// enough. Changes nothing.
std::optional<EvictionPlan> PlanEviction(const PrefixTree& tree, const ExpandedKvCache& expanded,
                                         const PageAllocator& pages, int64_t page_bytes, int layers,
                                         int64_t bytes);

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_EVICTION_H_
