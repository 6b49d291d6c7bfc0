#include "kernels/core/paged_kv_cache.h"

#include <vector>

#include "gtest/gtest.h"

namespace mlaserve {
namespace {

struct Fixture {
  std::vector<Bf16> pages = std::vector<Bf16>(4 * 8 * 2);
  std::vector<int32_t> table = {2, 0, 99, 3, 1, 99};  // 2 requests x 3 slots
  std::vector<int32_t> seqlens = {10, 16};

  PagedKvCache Cache() const {
    return {*TensorView<const Bf16, 3>::Create(std::span<const Bf16>(pages), {4, 8, 2})};
  }
  PagedSequences Seqs() const {
    return {*TensorView<const int32_t, 2>::Create(std::span<const int32_t>(table), {2, 3}),
            seqlens};
  }
};

TEST(PagedKvCacheTest, AcceptsTablesWhoseUnusedSlotsHoldGarbage) {
  Fixture f;
  EXPECT_TRUE(ValidatePagedSequences(f.Cache(), f.Seqs()).ok());
  f.pages[(0 * 8 + 1) * 2] = Bf16::FromFloat(5.0f);  // page 0 row 1 = token 9 of request 0
  EXPECT_EQ(TokenRow(f.Cache(), f.Seqs(), 0, 9)->ToFloat(), 5.0f);
}

TEST(PagedKvCacheTest, RejectsPageOutOfRange) {
  Fixture f;
  f.table[4] = 4;
  const absl::Status s = ValidatePagedSequences(f.Cache(), f.Seqs());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block_table[1][1]"), std::string::npos) << s;
}

TEST(PagedKvCacheTest, RejectsLengthsThatDoNotFitTheTable) {
  Fixture f;
  f.seqlens[1] = 25;
  EXPECT_FALSE(ValidatePagedSequences(f.Cache(), f.Seqs()).ok());
  f.seqlens[1] = -1;
  EXPECT_FALSE(ValidatePagedSequences(f.Cache(), f.Seqs()).ok());
}

}  // namespace
}  // namespace mlaserve
