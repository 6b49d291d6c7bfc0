#include "kernels/npu/global_memory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mlaserve::npu {

GlobalMemory::GlobalMemory(int64_t capacity, int64_t alignment)
    : capacity_(capacity), alignment_(alignment) {
  // Address 0 stays unused so a zero address is never a valid buffer.
  free_[static_cast<uint64_t>(alignment)] = capacity - alignment;
}

absl::StatusOr<uint64_t> GlobalMemory::Reserve(int64_t bytes, absl::string_view what) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("GM buffer '", what, "' has size ", bytes));
  }
  const int64_t size = (bytes + alignment_ - 1) / alignment_ * alignment_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t addr = it->first;
    const int64_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_[addr + size] = rest;
    live_[addr] = Live{size, bytes, std::string(what)};
    used_ += size;
    return addr;
  }
  return absl::ResourceExhaustedError(absl::StrCat("GM (HBM) full: '", what, "' needs ", bytes,
                                                   " B, ", capacity_ - used_, " B free of ",
                                                   capacity_));
}

absl::StatusOr<GmBuffer> GlobalMemory::Allocate(int64_t bytes, bool backed, absl::string_view what) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<uint64_t> addr = Reserve(bytes, what);
  if (!addr.ok()) return addr.status();
  GmBuffer buffer{*addr, bytes, nullptr};
  if (backed) {
    auto storage = std::make_unique_for_overwrite<std::byte[]>(bytes);
    buffer.host = storage.get();
    owned_[*addr] = std::move(storage);
  }
  return buffer;
}

absl::StatusOr<GmBuffer> GlobalMemory::Map(void* host, int64_t bytes, absl::string_view what) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<uint64_t> addr = Reserve(bytes, what);
  if (!addr.ok()) return addr.status();
  return GmBuffer{*addr, bytes, static_cast<std::byte*>(host)};
}

void GlobalMemory::Release(const GmBuffer& buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto live = live_.find(buffer.addr);
  if (live == live_.end()) return;
  int64_t size = live->second.reserved;
  live_.erase(live);
  owned_.erase(buffer.addr);
  used_ -= size;
  uint64_t addr = buffer.addr;
  // Coalesce with the neighbours on both sides.
  auto next = free_.lower_bound(addr);
  if (next != free_.end() && next->first == addr + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == addr) {
      prev->second += size;
      return;
    }
  }
  free_[addr] = size;
}

absl::Status GlobalMemory::CheckAccess(uint64_t addr, int64_t span) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(addr);
  if (it != live_.begin()) {
    --it;
    const uint64_t begin = it->first;
    const uint64_t end = begin + static_cast<uint64_t>(it->second.bytes);
    if (addr < end) {
      if (addr + static_cast<uint64_t>(span) <= end) return absl::OkStatus();
      return absl::OutOfRangeError(absl::StrCat(
          "access of ", span, " B at offset ", addr - begin, " overruns GM buffer '", it->second.what,
          "' (", it->second.bytes, " B) by ", addr + span - end, " B"));
    }
  }
  return absl::OutOfRangeError(
      absl::StrCat("access of ", span, " B at GM address ", addr, " hits no live buffer"));
}

int64_t GlobalMemory::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

GlobalMemory::AtomicGuard::AtomicGuard(GlobalMemory& gm, uint64_t addr, int64_t bytes) {
  if (bytes <= 0) return;
  const uint64_t first = addr >> kStripeShift;
  const uint64_t last = (addr + bytes - 1) >> kStripeShift;
  std::vector<int> stripes;
  for (uint64_t s = first; s <= last && stripes.size() < kStripes; ++s) {
    stripes.push_back(static_cast<int>(s % kStripes));
  }
  std::sort(stripes.begin(), stripes.end());  // one global order: no lock cycles
  stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
  for (int s : stripes) {
    gm.stripes_[s].lock();
    locked_.push_back(&gm.stripes_[s]);
  }
}

GlobalMemory::AtomicGuard::~AtomicGuard() {
  for (auto it = locked_.rbegin(); it != locked_.rend(); ++it) (*it)->unlock();
}

}  // namespace mlaserve::npu
