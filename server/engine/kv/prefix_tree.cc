#include "server/engine/kv/prefix_tree.h"

#include <utility>

namespace mlaserve::engine {

PrefixNode* PrefixTree::FindRegistered(absl::string_view id) const {
  const auto it = ids_.find(id);
  return it == ids_.end() ? nullptr : it->second;
}

PrefixNode* PrefixTree::FindLive(PrefixKey key) const {
  const auto it = nodes_.find(key);
  return it == nodes_.end() || !it->second->ready ? nullptr : it->second.get();
}

PrefixNode* PrefixTree::Insert(std::unique_ptr<PrefixNode> node) {
  node->key = next_key_++;
  PrefixNode* raw = node.get();
  if (raw->registered) ids_.emplace(raw->id, raw);
  nodes_.emplace(raw->key, std::move(node));
  return raw;
}

bool PrefixTree::Unregister(PrefixNode* node) {
  ids_.erase(node->id);
  node->registered = false;
  return node->references == 0;
}

PrefixNode* PrefixTree::Erase(PrefixNode* node) {
  PrefixNode* parent = node->parent;
  nodes_.erase(node->key);
  return parent;
}

}  // namespace mlaserve::engine
