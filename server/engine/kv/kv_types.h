#ifndef MLASERVE_SERVER_ENGINE_KV_KV_TYPES_H_
#define MLASERVE_SERVER_ENGINE_KV_KV_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/engine/kv/prefix_key.h"

namespace mlaserve::engine {

// The KV store's value types, for callers that configure it or read its state without
// needing the store itself (kv_store.h).

struct KvStoreOptions {
  // Everything the store holds counts against this: latent pages in use (sequences',
  // prefixes', and released ones still pinned by snapshots) plus expanded K/V.
  int64_t budget_bytes = 0;
  // Tokens per page (the paper's and vLLM-Ascend's block size).
  int page_size = 128;
};

struct KvStoreStats {
  int64_t budget_bytes = 0;
  int64_t used_bytes = 0;  // pages_used * page bytes + expanded_bytes
  int64_t page_bytes = 0;
  int32_t pages_total = 0;
  int32_t pages_used = 0;
  int32_t pages_free = 0;      // in the pool; expanded K/V shares the budget, so fewer may fit
  int32_t pages_prefix = 0;    // held by a prefix (maybe shared with sequences)
  int32_t pages_sequence = 0;  // held by sequences only
  int32_t pages_pinned = 0;    // released, kept alive by a snapshot
  int64_t expanded_bytes = 0;  // built or being built
  int32_t expanded_entries = 0;
  int32_t prefixes = 0;           // registered
  int32_t retained_prefixes = 0;  // released, alive while something references them
  int32_t sequences = 0;
  int64_t prefix_evictions = 0;
  int64_t expanded_evictions = 0;

  friend bool operator==(const KvStoreStats&, const KvStoreStats&) = default;
};

struct PrefixInfo {
  std::string id;
  PrefixKey key = 0;
  std::string parent_id;  // empty for a root prefix
  int32_t begin = 0;      // tokens [begin, end) are this prefix's own; [0, begin) its parent's
  int32_t end = 0;
  bool referenced = false;  // by a child, a sequence, a snapshot or an expanded K/V handle

  friend bool operator==(const PrefixInfo&, const PrefixInfo&) = default;
};

struct SequenceInfo {
  std::string id;
  std::string prefix_id;         // the prefix it starts on (a fork's is its source's), or ""
  std::vector<int32_t> lengths;  // tokens per layer

  friend bool operator==(const SequenceInfo&, const SequenceInfo&) = default;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_KV_TYPES_H_
