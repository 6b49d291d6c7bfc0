#include "client/dataplane/region_arrays.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve::client {
namespace {

TEST(RegionArraysTest, BlocksAreAlignedDisjointAndInsideTheArea) {
  RegionArrays arrays(1000, 1000 + 64 * 100);
  EXPECT_EQ(arrays.begin(), 1024u);
  std::vector<std::pair<uint64_t, uint64_t>> blocks;
  for (uint64_t bytes : {1, 64, 65, 640, 3}) {
    const std::optional<uint64_t> at = arrays.Allocate(bytes);
    ASSERT_TRUE(at.has_value()) << bytes;
    EXPECT_EQ(*at % 64, 0u);
    EXPECT_GE(*at, arrays.begin());
    EXPECT_LE(*at + bytes, arrays.end());
    for (const auto& [other, size] : blocks) {
      EXPECT_TRUE(*at + bytes <= other || other + size <= *at) << *at << " overlaps " << other;
    }
    blocks.push_back({*at, bytes});
  }
}

TEST(RegionArraysTest, AFullAreaSaysSoAndFreedBlocksMergeBackIntoOne) {
  RegionArrays arrays(0, 64 * 10);
  std::vector<uint64_t> at;
  for (int i = 0; i < 10; ++i) {
    const std::optional<uint64_t> block = arrays.Allocate(64);
    ASSERT_TRUE(block.has_value());
    at.push_back(*block);
  }
  EXPECT_FALSE(arrays.Allocate(1).has_value());
  EXPECT_EQ(arrays.free_bytes(), 0u);
  // Freed in a shuffled order, they merge into one range that holds the whole area again.
  std::shuffle(at.begin(), at.end(), std::mt19937(std::random_device{}()));
  for (uint64_t a : at) arrays.Free(a);
  EXPECT_EQ(arrays.free_bytes(), 640u);
  const std::optional<uint64_t> whole = arrays.Allocate(640);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(*whole, 0u);
}

TEST(RegionArraysTest, AnOffsetNotAllocatedIsIgnored) {
  RegionArrays arrays(0, 640);
  const std::optional<uint64_t> a = arrays.Allocate(128);
  ASSERT_TRUE(a.has_value());
  arrays.Free(*a + 64);
  arrays.Free(*a);
  arrays.Free(*a);  // twice
  EXPECT_EQ(arrays.free_bytes(), 640u);
}

// A block an abandoned call may still be answered into is never handed out again, whether
// freed before or after it was retired; its neighbours are.
TEST(RegionArraysTest, ARetiredBlockIsNeverHandedOutAgain) {
  RegionArrays arrays(0, 64 * 4);
  const std::optional<uint64_t> a = arrays.Allocate(64);
  const std::optional<uint64_t> b = arrays.Allocate(128);
  const std::optional<uint64_t> c = arrays.Allocate(64);
  ASSERT_TRUE(a && b && c);
  arrays.Retire(*b + 64, 16);  // inside b
  arrays.Free(*a);
  arrays.Free(*b);
  arrays.Free(*c);
  EXPECT_EQ(arrays.free_bytes(), 128u);
  for (int i = 0; i < 2; ++i) {
    const std::optional<uint64_t> again = arrays.Allocate(64);
    ASSERT_TRUE(again.has_value());
    EXPECT_TRUE(*again + 64 <= *b || *again >= *b + 128) << *again;
  }
  EXPECT_FALSE(arrays.Allocate(64).has_value());
}

TEST(RegionArraysTest, MoreThanTheAreaIsRefused) {
  RegionArrays arrays(0, 640);
  EXPECT_FALSE(arrays.Allocate(641).has_value());
  EXPECT_FALSE(arrays.Allocate(UINT64_MAX).has_value());
  EXPECT_TRUE(arrays.Allocate(640).has_value());
}

}  // namespace
}  // namespace mlaserve::client
