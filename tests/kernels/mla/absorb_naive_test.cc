#include <cmath>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/mla/absorb.h"
#include "kernels/mla/naive.h"
#include "kernels/reference/golden_attention.h"
#include "tests/testing/attention_checks.h"
#include "tests/testing/random_batch.h"

namespace mlaserve {
namespace {

// Head-space outputs pass through more bf16 casts than a latent kernel (q_lat and o_lat in
// the absorb form, the expanded K/V in the naive form), each adding up to 2^-9 relative
// error; the element bounds stay FlashMLA's (scaled to unit-sigma data, see
// FlashMlaOutTolerance), the cosine bound is widened to cover two extra roundings
// (2e-5; one bf16 rounding alone gives ~2e-6).
constexpr testing::Tolerance kHeadSpaceOutTolerance{testing::FlashMlaOutTolerance(1.0).abs_tol,
                                                    2.01 / 128, 2e-5};
// The LSE is a score, and one bf16 cast of q_lat (absorb) or of the expanded K (naive)
// moves a score by about scale * 2^-9/sqrt(3) * sigma_q * sigma_k * sqrt(512) = 1.8e-3 rms
// at unit sigma; the bound is five times that. (Latent kernels, with no such cast, meet
// FlashMLA's 1e-6.)
constexpr testing::Tolerance kHeadSpaceLseTolerance{1e-2, 8.01 / 65536, 0.0};

struct HeadSpaceShape {
  int heads;
  int sq;
};

class HeadSpaceFormsTest : public ::testing::TestWithParam<HeadSpaceShape> {
 protected:
  testing::RandomHeadSpaceBatch MakeBatch() const {
    Rng rng(300 + GetParam().heads + GetParam().sq);
    return testing::MakeRandomHeadSpaceBatch({.sq = GetParam().sq,
                                              .heads = GetParam().heads,
                                              .dk = 576,
                                              .page_size = 64,
                                              .seqlens = {0, 1, 65, 600, 1100}},
                                             rng);
  }
  const float scale_ = 1.0f / std::sqrt(192.0f);
};

TEST_P(HeadSpaceFormsTest, AbsorbMatchesFp64NaiveGolden) {
  const auto batch = MakeBatch();
  const HeadSpaceDecodeProblem problem = batch.Problem(scale_);
  auto golden = GoldenHeadSpaceDecode(problem);
  auto absorb = AbsorbDecode(problem, RescaleAlgorithm::kAmla);
  ASSERT_TRUE(golden.ok()) << golden.status();
  ASSERT_TRUE(absorb.ok()) << absorb.status();
  EXPECT_TRUE(testing::AllClose(absorb->out, golden->out, kHeadSpaceOutTolerance, true));
  EXPECT_TRUE(testing::AllClose(absorb->lse, golden->lse, kHeadSpaceLseTolerance, false));
}

TEST_P(HeadSpaceFormsTest, NaiveMatchesFp64NaiveGolden) {
  const auto batch = MakeBatch();
  const HeadSpaceDecodeProblem problem = batch.Problem(scale_);
  auto golden = GoldenHeadSpaceDecode(problem);
  auto naive = NaiveDecode(problem, RescaleAlgorithm::kAmla);
  ASSERT_TRUE(golden.ok() && naive.ok());
  EXPECT_TRUE(testing::AllClose(naive->out, golden->out, kHeadSpaceOutTolerance, true));
  EXPECT_TRUE(testing::AllClose(naive->lse, golden->lse, kHeadSpaceLseTolerance, false));
}

TEST_P(HeadSpaceFormsTest, NaiveAndAbsorbAgreeWithEachOther) {
  const auto batch = MakeBatch();
  const HeadSpaceDecodeProblem problem = batch.Problem(scale_);
  auto absorb = AbsorbDecode(problem, RescaleAlgorithm::kBase);
  auto naive = NaiveDecode(problem, RescaleAlgorithm::kBase);
  ASSERT_TRUE(absorb.ok() && naive.ok());
  // Both carry their own roundings, so allow the sum of both error budgets.
  constexpr testing::Tolerance kPairTolerance{2 * kHeadSpaceOutTolerance.abs_tol, 2 * 2.01 / 128,
                                              4e-5};
  EXPECT_TRUE(testing::AllCloseF(naive->out, absorb->out, kPairTolerance));
}

INSTANTIATE_TEST_SUITE_P(Shapes, HeadSpaceFormsTest,
                         ::testing::Values(HeadSpaceShape{1, 1}, HeadSpaceShape{16, 2},
                                           HeadSpaceShape{64, 1}, HeadSpaceShape{128, 2}),
                         [](const ::testing::TestParamInfo<HeadSpaceShape>& param_info) {
                           return absl::StrCat("h", param_info.param.heads, "_sq",
                                               param_info.param.sq);
                         });

TEST(HeadSpaceValidationTest, RejectsMismatchedWeights) {
  Rng rng(5);
  auto batch = testing::MakeRandomHeadSpaceBatch(
      {.sq = 1, .heads = 4, .dk = 576, .page_size = 64, .seqlens = {10}}, rng);
  HeadSpaceDecodeProblem problem = batch.Problem(0.1f);
  problem.weights.w_uk = *TensorView<const Bf16, 3>::Create(
      std::span<const Bf16>(batch.w_uk.data(), 3 * 128 * 512), {3, 128, 512});
  EXPECT_EQ(AbsorbDecode(problem).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NaiveDecode(problem).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mlaserve
