#ifndef MLASERVE_SERVER_ENGINE_KV_EXPANDED_KV_CACHE_H_
#define MLASERVE_SERVER_ENGINE_KV_EXPANDED_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/node_hash_map.h"
#include "server/engine/kv/expanded_kv.h"
#include "server/engine/kv/prefix_key.h"

namespace mlaserve::engine {

// The naive-form expansions a KV store keeps, one per (prefix, layer): built on demand
// outside the store's lock, pinned by ExpandedKv handles, evictable when unpinned, and
// counted in the memory budget from the moment their building starts. Not thread-safe:
// the store's mutex guards it.
class ExpandedKvCache {
 public:
  struct Entry {
    bool ready = false;  // false while being built
    std::unique_ptr<ExpandedKvData> data;
    int64_t bytes = 0;
    int32_t pins = 0;  // ExpandedKv handles
    uint64_t last_use = 0;
  };

  // The entry of (prefix, layer), building or ready, or nullptr. Entries stay where they are
  // until freed, so the pointer is stable.
  Entry* Find(PrefixKey prefix, int layer);
  const Entry* Find(PrefixKey prefix, int layer) const;
  // Starts an entry of `bytes` (counted at once); the builder publishes it when done.
  Entry& StartBuilding(PrefixKey prefix, int layer, int64_t bytes);
  void Publish(Entry& entry, std::unique_ptr<ExpandedKvData> data, uint64_t now);
  void Free(PrefixKey prefix, int layer);
  // Every ready entry of a prefix (it is being freed).
  void FreeAll(PrefixKey prefix, int layers);

  int64_t bytes() const { return bytes_; }
  int32_t entries() const { return static_cast<int32_t>(table_.size()); }
  // Calls f(prefix, layer, entry) for every ready entry.
  template <typename F>
  void ForEachReady(F f) const {
    for (const auto& [key, entry] : table_) {
      if (entry.ready) f(key.first, key.second, entry);
    }
  }

 private:
  absl::node_hash_map<std::pair<PrefixKey, int>, Entry> table_;
  int64_t bytes_ = 0;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_EXPANDED_KV_CACHE_H_
