// The L2 model against its documented semantics.
#include "kernels/npu/l2_cache_model.h"

#include <cstdint>
#include <random>
#include <unordered_map>

#include "gtest/gtest.h"

namespace mlaserve::npu {
namespace {

// The L2 model's documented semantics, written as plainly as possible: one hash-map entry
// per line ever touched. The model itself must give the same outcome for every access.
class ReferenceL2 {
 public:
  ReferenceL2(uint64_t capacity, uint64_t line) : capacity_(capacity), line_(line) {}
  L2CacheModel::Outcome Access(const GmRegion& region) {
    L2CacheModel::Outcome outcome;
    for (int64_t r = 0; r < region.rows; ++r) {
      const uint64_t lo = region.addr + static_cast<uint64_t>(r * region.stride);
      const uint64_t hi = lo + static_cast<uint64_t>(region.row_bytes);
      for (uint64_t line = lo / line_; line * line_ < hi; ++line) {
        const uint64_t bytes = std::min(hi, (line + 1) * line_) - std::max(lo, line * line_);
        const auto it = last_touch_.find(line);
        if (it != last_touch_.end() && traffic_ - it->second < capacity_) {
          outcome.hit_bytes += static_cast<int64_t>(bytes);
        } else {
          outcome.fetched_bytes += static_cast<int64_t>(line_);
        }
        last_touch_[line] = traffic_;
        traffic_ += bytes;
      }
    }
    return outcome;
  }

 private:
  uint64_t capacity_, line_;
  uint64_t traffic_ = 0;
  std::unordered_map<uint64_t, uint64_t> last_touch_;
};

TEST(L2CacheModelTest, ReuseDistanceIsCountedInBytesMoved) {
  L2CacheModel l2(/*capacity_bytes=*/1024, /*line_bytes=*/512);
  using HitFetched = std::pair<int64_t, int64_t>;
  auto access = [&](uint64_t addr, int64_t bytes) {
    const L2CacheModel::Outcome o = l2.Access({addr, 1, bytes, bytes});
    return HitFetched{o.hit_bytes, o.fetched_bytes};
  };
  EXPECT_EQ(access(512, 512), HitFetched(0, 512));      // cold
  EXPECT_EQ(access(512, 100), HitFetched(100, 0));      // 512 B since: resident
  EXPECT_EQ(access(600, 1000), HitFetched(424, 1024));  // line 1 hits, lines 2 and 3 miss
  EXPECT_EQ(access(1024, 1), HitFetched(1, 0));         // touched 576 B ago
  EXPECT_EQ(access(1536, 30), HitFetched(30, 0));       // touched 65 B ago
  EXPECT_EQ(access(512, 1), HitFetched(0, 512));        // 1031 B since: evicted
}

TEST(L2CacheModelTest, MatchesTheDocumentedSemanticsOnRandomStreams) {
  std::mt19937_64 rng(20260521);
  for (const uint64_t line : {512ull, 768ull, 4096ull}) {
    for (const uint64_t capacity : {0ull, 4096ull, 96ull << 10, 1ull << 20, 1ull << 40}) {
      L2CacheModel model(static_cast<int64_t>(capacity), static_cast<int64_t>(line));
      ReferenceL2 reference(capacity, line);
      int64_t hits = 0, misses = 0;
      for (int i = 0; i < 3000; ++i) {
        // Regions over 4 MiB (many 64 KiB blocks), unaligned, overlapping or strided rows,
        // now and then empty rows; later accesses revisit earlier ones.
        GmRegion region;
        region.addr = 4096 + rng() % (4 << 20);
        region.rows = static_cast<int64_t>(1 + rng() % 8);
        region.row_bytes = rng() % 16 == 0 ? 0 : static_cast<int64_t>(1 + rng() % 6000);
        switch (rng() % 3) {
          case 0:
            region.stride = region.row_bytes;
            break;
          case 1:
            region.stride = static_cast<int64_t>(rng() % (region.row_bytes + 1));
            break;
          default:
            region.stride = static_cast<int64_t>(rng() % 200000);
        }
        const L2CacheModel::Outcome got = model.Access(region);
        const L2CacheModel::Outcome want = reference.Access(region);
        ASSERT_EQ(got.hit_bytes, want.hit_bytes)
            << "line " << line << " capacity " << capacity << " #" << i;
        ASSERT_EQ(got.fetched_bytes, want.fetched_bytes)
            << "line " << line << " capacity " << capacity << " #" << i;
        hits += got.hit_bytes;
        misses += got.fetched_bytes;
      }
      // The streams exercise both outcomes wherever the capacity allows a hit at all.
      if (capacity > line) {
        EXPECT_GT(hits, 0) << line << " " << capacity;
      }
      EXPECT_GT(misses, 0);
    }
  }
}

}  // namespace
}  // namespace mlaserve::npu
