#ifndef MLASERVE_CLIENT_DATAPLANE_REGION_ARRAYS_H_
#define MLASERVE_CLIENT_DATAPLANE_REGION_ARRAYS_H_

#include <cstdint>
#include <map>
#include <optional>

#include "absl/synchronization/mutex.h"

namespace mlaserve::client {

// The part of a data-plane region set aside for arrays a caller allocates there
// (ShmChannel::AllocateArray): first fit over [begin, end), blocks 64-byte aligned, freed
// blocks merged with their free neighbours. Offsets are the region's. Thread-safe.
class RegionArrays {
 public:
  RegionArrays(uint64_t begin, uint64_t end);

  // A block of at least `bytes` (rounded up to 64), or nullopt when no free range holds it.
  std::optional<uint64_t> Allocate(uint64_t bytes);
  // Gives back the block Allocate returned at `offset` (a retired block is not reused).
  void Free(uint64_t offset);
  // The blocks overlapping [offset, offset + bytes) are never handed out again: a call that
  // names them was abandoned and its answer may still be written there.
  void Retire(uint64_t offset, uint64_t bytes);

  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  uint64_t free_bytes() const;

 private:
  const uint64_t begin_;
  const uint64_t end_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
  std::map<uint64_t, uint64_t> used_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
  std::map<uint64_t, bool> retired_ ABSL_GUARDED_BY(mu_);   // used blocks never to be reused
};

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_DATAPLANE_REGION_ARRAYS_H_
