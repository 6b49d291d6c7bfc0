#ifndef MLASERVE_SERVER_ENGINE_KV_KV_TYPES_H_
#define MLASERVE_SERVER_ENGINE_KV_KV_TYPES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/core/kv_dtype.h"
#include "server/engine/kv/prefix_key.h"

namespace mlaserve::engine {

class ExpansionBuilder;   // expansion_builder.h
class PageWriteListener;  // page_write_log.h

// The KV store's value types, for callers that configure it or read its state without
// needing the store itself (kv_store.h).

struct KvStoreOptions {
  // Everything the store holds counts against this: latent pages in use (sequences',
  // prefixes', and released ones still pinned by snapshots) plus expanded K/V.
  int64_t budget_bytes = 0;
  // Tokens per bf16 page (the paper's and vLLM-Ascend's block size); an FP8 page fills the
  // same bytes with more tokens (PagePool).
  int page_size = 128;
  // The format of a prefix or sequence created without one (and with no parent to inherit
  // from): the server's --kv_dtype.
  KvDtype default_kv_dtype = KvDtype::kBf16;
  // Tenants' KV quotas, by namespace (client_id.h): the latent pages a tenant's prefixes and
  // sequences hold stay within its quota, inside the global budget. A namespace not listed
  // has none but the global budget.
  std::map<std::string, int64_t> namespace_budget_bytes = {};
  // A device that keeps its own copy of the pool (a GPU) is told of every write into it.
  std::shared_ptr<PageWriteListener> page_writes = nullptr;
  // Where naive-form expansions are built and kept; null: on the host.
  std::shared_ptr<ExpansionBuilder> expansions = nullptr;
};

struct KvStoreStats {
  int64_t budget_bytes = 0;
  int64_t used_bytes = 0;  // pages_used * page bytes + expanded_bytes
  int64_t page_bytes = 0;
  int32_t page_tokens_bf16 = 0;  // tokens a page holds in each format
  int32_t page_tokens_fp8 = 0;
  int32_t pages_total = 0;
  int32_t pages_used = 0;
  int32_t pages_free = 0;      // in the pool; expanded K/V shares the budget, so fewer may fit
  int32_t pages_prefix = 0;    // held by a prefix (maybe shared with sequences)
  int32_t pages_sequence = 0;  // held by sequences only
  int32_t pages_pinned = 0;    // released, kept alive by a snapshot
  int32_t pages_touched = 0;   // ever written, so resident in RAM (PageAllocator::num_touched)
  int64_t expanded_bytes = 0;  // built or being built
  int32_t expanded_entries = 0;
  int32_t prefixes = 0;           // registered
  int32_t retained_prefixes = 0;  // released, alive while something references them
  int32_t sequences = 0;
  int64_t prefix_evictions = 0;
  int64_t expanded_evictions = 0;
  // Latent page bytes each tenant's namespace holds (those that ever held any).
  std::map<std::string, int64_t> namespace_used_bytes = {};

  friend bool operator==(const KvStoreStats&, const KvStoreStats&) = default;
};

struct PrefixInfo {
  std::string id;
  PrefixKey key = 0;
  std::string parent_id;  // empty for a root prefix
  int32_t begin = 0;      // tokens [begin, end) are this prefix's own; [0, begin) its parent's
  int32_t end = 0;
  bool referenced = false;  // by a child, a sequence, a snapshot or an expanded K/V handle
  KvDtype kv_dtype = KvDtype::kBf16;

  friend bool operator==(const PrefixInfo&, const PrefixInfo&) = default;
};

// Which entries a listing returns: ids in bytewise order that start with `id_prefix` (a
// tenant's namespace; "" for all) and come after `after` ("" for the first page), at most
// `limit` of them.
struct ListRange {
  std::string id_prefix;
  std::string after;
  int limit = 100;
};

// One page of a listing; `matching` counts every entry in range, on every page.
template <typename Entry>
struct ListPage {
  std::vector<Entry> entries;
  bool more = false;  // entries follow the last one returned
  int64_t matching = 0;
};

struct PrefixListing {
  PrefixInfo info;
  int64_t pages = 0;  // pages of its own tokens, all layers
};

struct SequenceInfo {
  std::string id;
  std::string prefix_id;         // the prefix it starts on (a fork's is its source's), or ""
  std::vector<int32_t> lengths;  // tokens per layer
  KvDtype kv_dtype = KvDtype::kBf16;

  friend bool operator==(const SequenceInfo&, const SequenceInfo&) = default;
};

struct SequenceListing {
  SequenceInfo info;
  int64_t pages = 0;         // in its layers' page lists (a prefix's pages included)
  int64_t shared_pages = 0;  // of those, held by another sequence or prefix too
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_KV_TYPES_H_
