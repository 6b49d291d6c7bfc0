#ifndef MLASERVE_SERVER_ENGINE_KV_KV_STORE_INTERNAL_H_
#define MLASERVE_SERVER_ENGINE_KV_KV_STORE_INTERNAL_H_

// What the files that implement KvStore share (kv_store.cc, kv_store_*.cc); no one else
// includes it.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "server/engine/kv/kv_store.h"
#include "server/engine/kv/kv_types.h"
#include "server/engine/kv/prefix_tree.h"

namespace mlaserve::engine {

// The most tokens a prefix or a sequence layer may hold (token positions are int32).
inline constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();

struct KvStore::Sequence {
  // How it came to be, so that a retried create or fork can be recognised.
  enum class Origin { kCreated, kForked };

  struct Layer {
    std::vector<int32_t> pages;  // ceil(length / page_size) pages
    int32_t length = 0;
    bool appending = false;  // rows are being copied in outside the lock
  };

  std::string id;
  Origin origin = Origin::kCreated;
  std::string origin_id;         // the prefix id it was created on, or the fork source
  PrefixNode* prefix = nullptr;  // referenced by this sequence
  KvDtype kv_dtype = KvDtype::kBf16;
  std::vector<Layer> layers;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_KV_STORE_INTERNAL_H_
