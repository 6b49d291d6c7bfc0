#ifndef MLASERVE_SERVER_ENGINE_KV_PREFIX_TREE_H_
#define MLASERVE_SERVER_ENGINE_KV_PREFIX_TREE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "kernels/core/kv_dtype.h"
#include "server/engine/kv/prefix_key.h"

namespace mlaserve::engine {

// A registered run of tokens with rows for every layer. Its page lists cover [0, end): the
// full pages of its parent chain, shared, then its own. It never writes a page after
// registration, and everyone who shares its pages copies before writing, so its rows are
// immutable while it lives.
struct PrefixNode {
  PrefixKey key = 0;
  std::string id;
  std::string parent_id;
  PrefixNode* parent = nullptr;  // referenced by this node
  int32_t begin = 0;
  int32_t end = 0;
  std::vector<std::vector<int32_t>> pages;  // [layer]
  KvDtype kv_dtype = KvDtype::kBf16;        // the format of its pages (and its children's)
  bool ready = false;                       // false while its rows are being copied in
  bool registered = true;                   // false once released or evicted
  // Children, sequences started on it, snapshots, expansion handles and operations in
  // flight. A registered node with none is evictable; an unregistered one is dead at zero.
  int64_t references = 0;
  uint64_t last_use = 0;  // on the tree's LRU clock
};

// The prefixes a KV store holds: by key, by registered id, with their references and their
// recency. A node lives while it is registered or referenced; when it is neither (dead), the
// store frees what it holds (pages, expansions) and erases it, which drops its reference on
// its parent in turn. Not thread-safe: the store's mutex guards it.
class PrefixTree {
 public:
  // The node registered (or being registered) under `id`, or nullptr.
  PrefixNode* FindRegistered(absl::string_view id) const;
  // The ready node of `key` (registered or only referenced), or nullptr.
  PrefixNode* FindLive(PrefixKey key) const;
  // Takes a new node, gives it the next key and registers its id (unless the node comes
  // unregistered: a released prefix brought back by a restore).
  PrefixNode* Insert(std::unique_ptr<PrefixNode> node);

  // The LRU clock: every use of a prefix (or of its expansions) gets the next tick.
  uint64_t Tick() { return ++clock_; }
  void Touch(PrefixNode* node) { node->last_use = Tick(); }

  void AddReference(PrefixNode* node) { ++node->references; }
  // True when that was the last reference of an unregistered node: it is dead.
  bool DropReference(PrefixNode* node) { return --node->references == 0 && !node->registered; }
  // Frees the id; true when nothing references the node: it is dead.
  bool Unregister(PrefixNode* node);
  // Removes a dead node; returns its parent, whose reference the caller must drop.
  PrefixNode* Erase(PrefixNode* node);

  int registered() const { return static_cast<int>(ids_.size()); }
  int retained() const { return static_cast<int>(nodes_.size() - ids_.size()); }
  const absl::flat_hash_map<PrefixKey, std::unique_ptr<PrefixNode>>& nodes() const {
    return nodes_;
  }

 private:
  absl::flat_hash_map<PrefixKey, std::unique_ptr<PrefixNode>> nodes_;  // every live node
  absl::flat_hash_map<std::string, PrefixNode*> ids_;                  // registered ids
  PrefixKey next_key_ = 1;
  uint64_t clock_ = 0;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_PREFIX_TREE_H_
