#include "kernels/npu/l2_cache_model.h"

#include <algorithm>

namespace mlaserve::npu {

L2CacheModel::L2CacheModel(int64_t capacity_bytes, int64_t line_bytes)
    : capacity_(capacity_bytes), line_bytes_(line_bytes) {}

L2CacheModel::Outcome L2CacheModel::Access(const GmRegion& region) {
  Outcome outcome;
  for (int64_t r = 0; r < region.rows; ++r) {
    const uint64_t lo = region.addr + static_cast<uint64_t>(r * region.stride);
    const uint64_t hi = lo + static_cast<uint64_t>(region.row_bytes);
    for (uint64_t line = lo / line_bytes_; line * line_bytes_ < hi; ++line) {
      const uint64_t a = std::max<uint64_t>(lo, line * line_bytes_);
      const uint64_t b = std::min<uint64_t>(hi, (line + 1) * line_bytes_);
      auto [it, inserted] = last_touch_.try_emplace(line, traffic_);
      if (!inserted && traffic_ - it->second < static_cast<uint64_t>(capacity_)) {
        outcome.hit_bytes += static_cast<int64_t>(b - a);
      } else {
        outcome.fetched_bytes += line_bytes_;
      }
      it->second = traffic_;
      traffic_ += b - a;
    }
  }
  return outcome;
}

}  // namespace mlaserve::npu
