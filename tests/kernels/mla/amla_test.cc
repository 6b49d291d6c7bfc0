#include "kernels/mla/amla.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "kernels/mla/flash_base.h"
#include "kernels/reference/golden_attention.h"
#include "tests/testing/attention_checks.h"
#include "tests/testing/kernel_sweep.h"
#include "tests/testing/random_batch.h"

namespace mlaserve {
namespace {

using testing::SweepPoint;

class AmlaSweepTest : public ::testing::TestWithParam<SweepPoint> {};

TEST_P(AmlaSweepTest, MatchesGoldenWithinFlashMlaTolerances) {
  testing::ExpectSweepPointMatchesGolden(
      GetParam(), 200, [](const LatentDecodeProblem& problem) { return AmlaDecode(problem); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, AmlaSweepTest, ::testing::ValuesIn(testing::KernelSweep()),
                         testing::SweepName);

TEST(AmlaTest, FlashMlaTestDataRecipe) {
  // FlashMLA's own test data: q and k ~ randn / 10, DeepSeek's scale 1/sqrt(192).
  Rng rng(31);
  const auto batch = testing::MakeRandomPagedBatch({.sq = 2,
                                                    .heads = 128,
                                                    .dk = 576,
                                                    .page_size = 64,
                                                    .seqlens = {20, 140, 4096},
                                                    .q_sigma = 0.1,
                                                    .kv_sigma = 0.1},
                                                   rng);
  const LatentDecodeProblem problem = batch.Latent(512, 1.0f / std::sqrt(192.0f));
  auto golden = GoldenLatentDecode(problem);
  auto amla = AmlaDecode(problem);
  ASSERT_TRUE(golden.ok() && amla.ok());
  EXPECT_TRUE(testing::AllClose(amla->out, golden->out, testing::kFlashMlaOutTolerance, true));
  EXPECT_TRUE(testing::AllClose(amla->lse, golden->lse, testing::kFlashMlaLseTolerance, false));
}

TEST(AmlaTest, LargeScoresForceBigExponentShiftsAndStayAccurate) {
  // sigma = 10 makes the running max jump by many powers of two between blocks, so the
  // int32 rescale and its -30 clamp are exercised, not just the mantissa correction.
  Rng rng(32);
  const auto batch = testing::MakeRandomPagedBatch({.sq = 1,
                                                    .heads = 16,
                                                    .dk = 576,
                                                    .page_size = 128,
                                                    .seqlens = {3000},
                                                    .q_sigma = 10.0,
                                                    .kv_sigma = 10.0},
                                                   rng);
  const LatentDecodeProblem problem = batch.Latent(512, 1.0f / std::sqrt(576.0f));
  auto golden = GoldenLatentDecode(problem);
  auto amla = AmlaDecode(problem);
  ASSERT_TRUE(golden.ok() && amla.ok());
  EXPECT_TRUE(testing::AllClose(amla->out, golden->out, testing::FlashMlaOutTolerance(10.0), true));
  EXPECT_TRUE(testing::AllClose(amla->lse, golden->lse, testing::kFlashMlaLseTolerance, false));
}

TEST(AmlaTest, ZeroValueColumnsStayZeroAcrossRescales) {
  // A latent column that is zero for every token keeps its accumulator at exactly 0.0.
  // The raw int32 add would turn it into -inf/NaN at the first rescale; the guarded add
  // must leave it alone while the other columns still match golden.
  Rng rng(33);
  auto batch = testing::MakeRandomPagedBatch({.sq = 1,
                                              .heads = 8,
                                              .dk = 576,
                                              .page_size = 128,
                                              .seqlens = {1500},
                                              .q_sigma = 3,
                                              .kv_sigma = 3},
                                             rng);
  for (size_t t = 0; t < batch.pages.size() / 576; ++t) {
    if (!std::isnan(batch.pages[t * 576].ToFloat()))
      batch.pages[t * 576 + 17] = Bf16::FromFloat(0.0f);
  }
  const LatentDecodeProblem problem = batch.Latent(512, 1.0f / std::sqrt(576.0f));
  auto golden = GoldenLatentDecode(problem);
  auto amla = AmlaDecode(problem);
  ASSERT_TRUE(golden.ok() && amla.ok());
  for (int h = 0; h < 8; ++h) EXPECT_EQ(amla->out[h * 512 + 17], 0.0f);
  EXPECT_TRUE(testing::AllClose(amla->out, golden->out, testing::FlashMlaOutTolerance(3.0), true));
}

TEST(AmlaTest, EmptySequenceGivesZerosAndNegativeInfinity) {
  Rng rng(34);
  const auto batch = testing::MakeRandomPagedBatch(
      {.sq = 2, .heads = 4, .dk = 576, .page_size = 64, .seqlens = {0, 1}}, rng);
  auto amla = AmlaDecode(batch.Latent(512, 0.1f));
  ASSERT_TRUE(amla.ok());
  for (int row = 0; row < 2 * 4; ++row) {
    EXPECT_EQ(amla->lse[row], -std::numeric_limits<float>::infinity());
    for (int d = 0; d < 512; ++d) ASSERT_EQ(amla->out[row * 512 + d], 0.0f);
  }
  // Request 1 has one key and two MTP tokens: token 0 sees nothing, token 1 sees the key.
  EXPECT_EQ(amla->lse[8 + 0], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isfinite(amla->lse[8 + 4]));
}

TEST(AmlaTest, RejectsInvalidProblems) {
  Rng rng(35);
  auto batch = testing::MakeRandomPagedBatch(
      {.sq = 1, .heads = 4, .dk = 576, .page_size = 64, .seqlens = {10}}, rng);
  EXPECT_EQ(AmlaDecode(batch.Latent(512, 0.0f)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AmlaDecode(batch.Latent(600, 0.1f)).status().code(),
            absl::StatusCode::kInvalidArgument);
  batch.block_table[0] = batch.num_pages;
  EXPECT_EQ(AmlaDecode(batch.Latent(512, 0.1f)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mlaserve
