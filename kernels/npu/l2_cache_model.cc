#include "kernels/npu/l2_cache_model.h"

#include <algorithm>
#include <bit>

namespace mlaserve::npu {

void L2CacheModel::Reset(int64_t capacity_bytes, int64_t line_bytes) {
  capacity_ = static_cast<uint64_t>(capacity_bytes);
  line_bytes_ = static_cast<uint64_t>(line_bytes);
  line_shift_ = std::has_single_bit(line_bytes_) ? std::countr_zero(line_bytes_) : -1;
  never_ = uint64_t{0} - capacity_;
  traffic_ = 0;
  directory_.clear();
  stamps_.clear();
  cached_block_ = UINT64_MAX;
  cached_offset_ = 0;
}

void L2CacheModel::Look(uint64_t block) {
  const auto [it, inserted] =
      directory_.try_emplace(block, static_cast<uint32_t>(stamps_.size() / kLinesPerBlock));
  if (inserted) stamps_.resize(stamps_.size() + kLinesPerBlock, never_);
  cached_block_ = block;
  cached_offset_ = static_cast<size_t>(it->second) * kLinesPerBlock;
}

L2CacheModel::Outcome L2CacheModel::Access(const GmRegion& region) {
  uint64_t hit = 0, fetched = 0;
  for (int64_t r = 0; r < region.rows; ++r) {
    const uint64_t lo = region.addr + static_cast<uint64_t>(r * region.stride);
    const uint64_t hi = lo + static_cast<uint64_t>(region.row_bytes);
    uint64_t line = line_shift_ >= 0 ? lo >> line_shift_ : lo / line_bytes_;
    uint64_t line_lo = line * line_bytes_;
    while (line_lo < hi) {
      // The row's lines in this block, straight from the block's array.
      uint64_t* stamps = Lines(line >> kBlockShift);
      const uint64_t block_end = ((line >> kBlockShift) + 1) << kBlockShift;
      for (; line < block_end && line_lo < hi; ++line, line_lo += line_bytes_) {
        const uint64_t a = std::max(lo, line_lo);
        const uint64_t b = std::min(hi, line_lo + line_bytes_);
        uint64_t& stamp = stamps[line & (kLinesPerBlock - 1)];
        if (traffic_ - stamp < capacity_) {  // a never-touched stamp always misses
          hit += b - a;
        } else {
          fetched += line_bytes_;
        }
        stamp = traffic_;
        traffic_ += b - a;
      }
    }
  }
  return {static_cast<int64_t>(hit), static_cast<int64_t>(fetched)};
}

}  // namespace mlaserve::npu
