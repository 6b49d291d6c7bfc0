#include "server/engine/kv/expanded_kv_cache.h"

namespace mlaserve::engine {

ExpandedKvCache::Entry* ExpandedKvCache::Find(PrefixKey prefix, int layer) {
  const auto it = table_.find({prefix, layer});
  return it == table_.end() ? nullptr : &it->second;
}

const ExpandedKvCache::Entry* ExpandedKvCache::Find(PrefixKey prefix, int layer) const {
  const auto it = table_.find({prefix, layer});
  return it == table_.end() ? nullptr : &it->second;
}

ExpandedKvCache::Entry& ExpandedKvCache::StartBuilding(PrefixKey prefix, int layer, int64_t bytes) {
  Entry& entry = table_[{prefix, layer}];
  entry = Entry{};
  entry.bytes = bytes;
  bytes_ += bytes;
  return entry;
}

void ExpandedKvCache::Publish(Entry& entry, std::unique_ptr<ExpandedKvData> data, uint64_t now) {
  entry.data = std::move(data);
  entry.ready = true;
  entry.pins = 1;  // the builder's handle
  entry.last_use = now;
}

void ExpandedKvCache::Free(PrefixKey prefix, int layer) {
  const auto it = table_.find({prefix, layer});
  if (it == table_.end()) return;
  bytes_ -= it->second.bytes;
  table_.erase(it);
}

void ExpandedKvCache::FreeAll(PrefixKey prefix, int layers) {
  for (int layer = 0; layer < layers; ++layer) {
    if (const Entry* entry = Find(prefix, layer); entry != nullptr && entry->ready)
      Free(prefix, layer);
  }
}

}  // namespace mlaserve::engine
