#ifndef MLASERVE_SERVER_ENGINE_KV_KV_CHECKPOINT_H_
#define MLASERVE_SERVER_ENGINE_KV_KV_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "server/engine/kv/kv_state.h"

namespace mlaserve::engine {

class KvStore;

// A consistent picture of a KV store (KvStore::Checkpoint), taken under its lock in one
// step: the manifest of every prefix and sequence as they were then, and their pages pinned
// so that none is freed or reused while the checkpoint lives. The store keeps serving: the
// records a checkpoint reads are below every length it captured, which appends never write
// again (they only write past a length), so ReadPage needs no lock.
class KvCheckpoint {
 public:
  KvCheckpoint(KvCheckpoint&& other) noexcept;
  KvCheckpoint& operator=(KvCheckpoint&&) = delete;
  KvCheckpoint(const KvCheckpoint&) = delete;
  // Unpins the pages.
  ~KvCheckpoint();

  const KvStateManifest& manifest() const { return manifest_; }
  // Page `index`'s records (manifest().pages[index].tokens of them) into `out`, which holds
  // exactly that many bytes.
  void ReadPage(int32_t index, std::span<std::byte> out) const;

 private:
  friend class KvStore;
  KvCheckpoint(KvStore* store, KvStateManifest manifest, std::vector<int32_t> pool_pages)
      : store_(store), manifest_(std::move(manifest)), pool_pages_(std::move(pool_pages)) {}

  KvStore* store_;
  KvStateManifest manifest_;
  std::vector<int32_t> pool_pages_;  // [manifest page] the pool's page
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_KV_CHECKPOINT_H_
