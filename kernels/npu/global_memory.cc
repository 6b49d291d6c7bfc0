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

absl::StatusOr<GmBuffer> GlobalMemory::Allocate(int64_t bytes, bool backed,
                                                absl::string_view what) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<uint64_t> addr = Reserve(bytes, what);
  if (!addr.ok()) return addr.status();
  GmBuffer buffer{*addr, bytes, nullptr};
  if (backed) {
    Backing backing;
    // The smallest spare that fits, unless it would waste more than the request itself.
    auto spare = spares_.lower_bound(bytes);
    if (spare != spares_.end() && spare->first <= 2 * bytes) {
      backing = {std::move(spare->second.host), spare->first};
      spare_bytes_ -= spare->first;
      spares_.erase(spare);
    } else {
      backing = {std::make_unique_for_overwrite<std::byte[]>(bytes), bytes};
    }
    buffer.host = backing.host.get();
    owned_bytes_ += backing.bytes;
    peak_owned_bytes_ = std::max(peak_owned_bytes_, owned_bytes_);
    owned_[*addr] = std::move(backing);
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
  if (auto owned = owned_.find(buffer.addr); owned != owned_.end()) {
    Backing backing = std::move(owned->second);
    owned_.erase(owned);
    owned_bytes_ -= backing.bytes;
    spare_bytes_ += backing.bytes;
    spares_.emplace(backing.bytes, Spare{releases_++, std::move(backing.host)});
    // Keep no more than was ever live at once: drop the spares released longest ago.
    while (spare_bytes_ > peak_owned_bytes_) {
      auto oldest = spares_.begin();
      for (auto it = spares_.begin(); it != spares_.end(); ++it) {
        if (it->second.released < oldest->second.released) oldest = it;
      }
      spare_bytes_ -= oldest->first;
      spares_.erase(oldest);
    }
  }
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

absl::Status GlobalMemory::CheckAccessLocked(uint64_t addr, int64_t span, uint64_t* begin_out,
                                             uint64_t* end_out) const {
  auto it = live_.upper_bound(addr);
  if (it != live_.begin()) {
    --it;
    const uint64_t begin = it->first;
    const uint64_t end = begin + static_cast<uint64_t>(it->second.bytes);
    if (addr < end) {
      *begin_out = begin;
      *end_out = end;
      if (addr + static_cast<uint64_t>(span) <= end) return absl::OkStatus();
      return absl::OutOfRangeError(absl::StrCat(
          "access of ", span, " B at offset ", addr - begin, " overruns GM buffer '",
          it->second.what, "' (", it->second.bytes, " B) by ", addr + span - end, " B"));
    }
  }
  return absl::OutOfRangeError(
      absl::StrCat("access of ", span, " B at GM address ", addr, " hits no live buffer"));
}

absl::Status GlobalMemory::AccessChecker::Check(uint64_t addr, int64_t span) {
  if (addr >= begin_ && addr < end_ && addr + static_cast<uint64_t>(span) <= end_) {
    return absl::OkStatus();
  }
  return gm_.CheckAccessLocked(addr, span, &begin_, &end_);
}

int64_t GlobalMemory::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

int64_t GlobalMemory::spare_host_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spare_bytes_;
}

GlobalMemory::AtomicGuard::AtomicGuard(GlobalMemory& gm, uint64_t addr, int64_t bytes) : gm_(gm) {
  if (bytes <= 0) return;
  const uint64_t first = addr >> kStripeShift;
  const uint64_t last = (addr + bytes - 1) >> kStripeShift;
  if (last - first + 1 >= kStripes) {
    first_hi_ = kStripes - 1;  // every stripe
  } else {
    const int lo = static_cast<int>(first % kStripes), hi = static_cast<int>(last % kStripes);
    if (lo <= hi) {
      first_lo_ = lo;
      first_hi_ = hi;
    } else {  // wraps around: [0, hi] and [lo, kStripes)
      first_hi_ = hi;
      second_lo_ = lo;
      second_hi_ = kStripes - 1;
    }
  }
  for (int s = first_lo_; s <= first_hi_; ++s) gm_.stripes_[s].lock();
  for (int s = second_lo_; s <= second_hi_; ++s) gm_.stripes_[s].lock();
}

GlobalMemory::AtomicGuard::~AtomicGuard() {
  for (int s = second_hi_; s >= second_lo_; --s) gm_.stripes_[s].unlock();
  for (int s = first_hi_; s >= first_lo_; --s) gm_.stripes_[s].unlock();
}

}  // namespace mlaserve::npu
