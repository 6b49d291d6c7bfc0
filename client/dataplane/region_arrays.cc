#include "client/dataplane/region_arrays.h"

#include <algorithm>
#include <iterator>

namespace mlaserve::client {
namespace {

constexpr uint64_t kBlockAlign = 64;

uint64_t RoundUpToBlock(uint64_t n) { return (n + kBlockAlign - 1) / kBlockAlign * kBlockAlign; }

}  // namespace

RegionArrays::RegionArrays(uint64_t begin, uint64_t end)
    : begin_(RoundUpToBlock(begin)), end_(end / kBlockAlign * kBlockAlign) {
  if (end_ > begin_) free_[begin_] = end_ - begin_;
}

std::optional<uint64_t> RegionArrays::Allocate(uint64_t bytes) {
  if (bytes > end_ - std::min(begin_, end_)) return std::nullopt;
  const uint64_t size = RoundUpToBlock(bytes == 0 ? 1 : bytes);
  absl::MutexLock lock(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t at = it->first;
    const uint64_t left = it->second - size;
    free_.erase(it);
    if (left > 0) free_[at + size] = left;
    used_[at] = size;
    return at;
  }
  return std::nullopt;
}

void RegionArrays::Free(uint64_t offset) {
  absl::MutexLock lock(&mu_);
  auto used = used_.find(offset);
  if (used == used_.end()) return;
  uint64_t at = offset, size = used->second;
  used_.erase(used);
  if (retired_.erase(offset) > 0) return;
  auto next = free_.lower_bound(at);
  if (next != free_.end() && at + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == at) {
      at = previous->first;
      size += previous->second;
      free_.erase(previous);
    }
  }
  free_[at] = size;
}

void RegionArrays::Retire(uint64_t offset, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = used_.upper_bound(offset);
  if (it != used_.begin()) --it;
  for (; it != used_.end() && it->first < offset + std::max<uint64_t>(bytes, 1); ++it) {
    if (it->first + it->second > offset) retired_[it->first] = true;
  }
}

uint64_t RegionArrays::free_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [at, size] : free_) total += size;
  return total;
}

}  // namespace mlaserve::client
