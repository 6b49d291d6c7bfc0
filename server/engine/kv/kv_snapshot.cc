#include "server/engine/kv/kv_snapshot.h"

#include <algorithm>
#include <utility>

#include "kernels/core/tensor_view.h"
#include "server/engine/kv/kv_store.h"

namespace mlaserve::engine {

KvSnapshot::KvSnapshot(KvStore* store, int layer, PagedKvCache cache, Fp8PagedKvCache fp8_cache,
                       std::vector<SequenceSnapshot> sequences,
                       std::vector<PrefixKey> pinned_prefixes)
    : store_(store),
      layer_(layer),
      cache_(cache),
      fp8_cache_(fp8_cache),
      sequences_(std::move(sequences)),
      pinned_prefixes_(std::move(pinned_prefixes)) {
  for (const SequenceSnapshot& s : sequences_) {
    max_pages_ = std::max(max_pages_, static_cast<int>(s.pages.size()));
    seqlens_.push_back(s.length);
  }
  block_table_.assign(sequences_.size() * max_pages_, -1);
  for (size_t b = 0; b < sequences_.size(); ++b) {
    std::copy(sequences_[b].pages.begin(), sequences_[b].pages.end(),
              block_table_.begin() + b * max_pages_);
  }
}

KvSnapshot::KvSnapshot(KvSnapshot&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)),
      layer_(other.layer_),
      cache_(other.cache_),
      fp8_cache_(other.fp8_cache_),
      sequences_(std::move(other.sequences_)),
      pinned_prefixes_(std::move(other.pinned_prefixes_)),
      block_table_(std::move(other.block_table_)),
      max_pages_(other.max_pages_),
      seqlens_(std::move(other.seqlens_)) {}

KvSnapshot& KvSnapshot::operator=(KvSnapshot&& other) noexcept {
  if (this != &other) {
    Release();
    store_ = std::exchange(other.store_, nullptr);
    layer_ = other.layer_;
    cache_ = other.cache_;
    fp8_cache_ = other.fp8_cache_;
    sequences_ = std::move(other.sequences_);
    pinned_prefixes_ = std::move(other.pinned_prefixes_);
    block_table_ = std::move(other.block_table_);
    max_pages_ = other.max_pages_;
    seqlens_ = std::move(other.seqlens_);
  }
  return *this;
}

KvSnapshot::~KvSnapshot() { Release(); }

void KvSnapshot::Release() {
  if (store_ != nullptr) {
    std::exchange(store_, nullptr)->ReleaseSnapshot(sequences_, pinned_prefixes_);
  }
}

PagedSequences KvSnapshot::tables() const {
  // Shapes match the vectors by construction.
  return PagedSequences{
      *TensorView<const int32_t, 2>::Create(std::span<const int32_t>(block_table_),
                                            {batch(), max_pages_}, "block_table"),
      std::span<const int32_t>(seqlens_)};
}

}  // namespace mlaserve::engine
