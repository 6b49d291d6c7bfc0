#include "server/engine/kv/kv_checkpoint.h"

#include "server/engine/kv/kv_store.h"

namespace mlaserve::engine {

KvCheckpoint::KvCheckpoint(KvCheckpoint&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)),
      manifest_(std::move(other.manifest_)),
      pool_pages_(std::move(other.pool_pages_)) {}

KvCheckpoint::~KvCheckpoint() {
  if (store_ != nullptr) store_->ReleaseCheckpoint(pool_pages_);
}

void KvCheckpoint::ReadPage(int32_t index, std::span<std::byte> out) const {
  const KvStateManifest::Page& page = manifest_.pages[index];
  store_->pool_.ReadRecords(page.kv_dtype, pool_pages_[index], page.tokens, out.data());
}

}  // namespace mlaserve::engine
