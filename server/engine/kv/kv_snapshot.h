#ifndef MLASERVE_SERVER_ENGINE_KV_KV_SNAPSHOT_H_
#define MLASERVE_SERVER_ENGINE_KV_KV_SNAPSHOT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/kv_dtype.h"
#include "kernels/core/paged_kv_cache.h"
#include "server/engine/kv/prefix_key.h"

namespace mlaserve::engine {

class KvStore;

// One prefix of the chain a sequence starts on, as the tokens it contributes.
struct PrefixSpan {
  std::string id;  // the id it was registered under (it may have been released since)
  PrefixKey key = 0;
  int32_t begin = 0;  // its parent's end (0 for a root prefix)
  int32_t end = 0;

  friend bool operator==(const PrefixSpan&, const PrefixSpan&) = default;
};

// One sequence's layer as captured by a snapshot.
struct SequenceSnapshot {
  std::string id;
  int32_t length = 0;
  int page_size = 0;  // tokens a page of its format holds
  KvDtype kv_dtype = KvDtype::kBf16;
  // The block table: token t is row t % page_size of pool page pages[t / page_size].
  std::vector<int32_t> pages;
  // The registered prefixes the sequence starts on, root first; empty if none. The sequence
  // reads the prefixes' tokens [0, prefix_tokens()) and then its own.
  std::vector<PrefixSpan> prefixes;

  int32_t prefix_tokens() const { return prefixes.empty() ? 0 : prefixes.back().end; }
  // The tokens after the prefix chain: [prefix_tokens(), length).
  int32_t suffix_tokens() const { return length - prefix_tokens(); }
  // The suffix's pages; its first token is row suffix_first_row() of the first one (a prefix
  // need not end on a page boundary: the page that holds its tail and the suffix's head is
  // the sequence's own copy).
  std::span<const int32_t> suffix_pages() const {
    return std::span<const int32_t>(pages).subspan(prefix_tokens() / page_size);
  }
  int suffix_first_row() const { return prefix_tokens() % page_size; }
};

// What a decode batch reads for one layer, pinned: the pages in its block tables and the
// prefixes its sequences start on stay alive and unchanged while the snapshot lives, whatever
// appends, forks and releases happen meanwhile, so kernels run on it without any store lock.
// Rows at or beyond a sequence's captured length may change (appends); nothing below does.
// Must not outlive the store. Move-only.
class KvSnapshot {
 public:
  KvSnapshot(KvSnapshot&& other) noexcept;
  KvSnapshot& operator=(KvSnapshot&& other) noexcept;
  KvSnapshot(const KvSnapshot&) = delete;
  KvSnapshot& operator=(const KvSnapshot&) = delete;
  ~KvSnapshot();

  int layer() const { return layer_; }
  int batch() const { return static_cast<int>(sequences_.size()); }
  const SequenceSnapshot& sequence(int b) const { return sequences_[b]; }

  // The whole page pool, the cache the tables below index: as bf16 pages, and as FP8 pages
  // (each sequence's kv_dtype says which its table indexes).
  const PagedKvCache& cache() const { return cache_; }
  const Fp8PagedKvCache& fp8_cache() const { return fp8_cache_; }
  // FlashMLA-style tables for the batch: block_table [batch][max pages] (unused slots -1) and
  // seqlens [batch], in the order the sequences were asked for. Valid while this lives.
  PagedSequences tables() const;

 private:
  friend class KvStore;
  KvSnapshot(KvStore* store, int layer, PagedKvCache cache, Fp8PagedKvCache fp8_cache,
             std::vector<SequenceSnapshot> sequences, std::vector<PrefixKey> pinned_prefixes);
  void Release();

  KvStore* store_ = nullptr;
  int layer_ = 0;
  PagedKvCache cache_;
  Fp8PagedKvCache fp8_cache_;
  std::vector<SequenceSnapshot> sequences_;
  std::vector<PrefixKey> pinned_prefixes_;  // one per sequence that starts on a prefix
  std::vector<int32_t> block_table_;        // [batch][max_pages_]
  int max_pages_ = 0;
  std::vector<int32_t> seqlens_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_KV_SNAPSHOT_H_
