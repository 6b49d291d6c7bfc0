#include "kernels/mla/lse_combine.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/amla.h"
#include "kernels/reference/golden_attention.h"
#include "tests/testing/attention_checks.h"
#include "tests/testing/random_batch.h"

namespace mlaserve {
namespace {

constexpr int kDv = 512;

// Partial attention of every row over keys [begin, end) of one request, through AMLA.
struct Partial {
  std::vector<float> out;
  std::vector<float> lse;
};

Partial AttendRange(const testing::RandomPagedBatch& batch, int begin, int end, float scale) {
  const LatentDecodeProblem p = batch.Latent(kDv, scale, /*causal=*/false);
  const int rows = p.heads();
  std::vector<float> q(static_cast<size_t>(rows) * p.dk());
  for (int h = 0; h < rows; ++h)
    for (int d = 0; d < p.dk(); ++d)
      q[static_cast<size_t>(h) * p.dk() + d] = p.q(0, 0, h, d).ToFloat();
  std::vector<float> k(static_cast<size_t>(end - begin) * p.dk());
  for (int t = begin; t < end; ++t)
    for (int d = 0; d < p.dk(); ++d)
      k[static_cast<size_t>(t - begin) * p.dk() + d] = TokenRow(p.cache, p.seqs, 0, t)[d].ToFloat();
  std::vector<Bf16> kb(k.size());
  for (size_t i = 0; i < k.size(); ++i) kb[i] = Bf16::FromFloat(k[i]);
  DenseKvSource source(kb.data(), p.dk(), p.dk(), kb.data(), p.dk(), kDv, end - begin);
  std::vector<int32_t> visible(rows, end - begin);
  Partial part{std::vector<float>(static_cast<size_t>(rows) * kDv), std::vector<float>(rows)};
  AmlaRows(QueryRows{q.data(), p.dk(), rows, p.dk(), visible}, source, scale, AmlaOptions{},
           RowOutputs{part.out.data(), kDv, part.lse.data()});
  return part;
}

Partial Combine(const Partial& a, const Partial& b) {
  Partial c{std::vector<float>(a.out.size()), std::vector<float>(a.lse.size())};
  CombineLseRows(static_cast<int>(a.lse.size()), kDv, a.out.data(), a.lse.data(), b.out.data(),
                 b.lse.data(), kDv, c.out.data(), c.lse.data());
  return c;
}

class LseCombineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Rng rng(41);
    batch_ = testing::MakeRandomPagedBatch(
        {.sq = 1, .heads = 16, .dk = 576, .page_size = 64, .seqlens = {1500}}, rng);
    golden_ = *GoldenLatentDecode(batch_.Latent(kDv, scale_, false));
  }
  float scale_ = 1.0f / std::sqrt(576.0f);
  testing::RandomPagedBatch batch_;
  GoldenOutput golden_;
};

TEST_F(LseCombineTest, SplitAttentionMergedEqualsWholeAttention) {
  const Partial merged =
      Combine(AttendRange(batch_, 0, 700, scale_), AttendRange(batch_, 700, 1500, scale_));
  EXPECT_TRUE(testing::AllClose(merged.out, golden_.out, testing::FlashMlaOutTolerance(1.0), true));
  EXPECT_TRUE(testing::AllClose(merged.lse, golden_.lse, testing::kFlashMlaLseTolerance, false));
}

TEST_F(LseCombineTest, AssociativeAndOrderIndependent) {
  const Partial a = AttendRange(batch_, 0, 300, scale_);
  const Partial b = AttendRange(batch_, 300, 1100, scale_);
  const Partial c = AttendRange(batch_, 1100, 1500, scale_);
  const Partial left = Combine(Combine(a, b), c);
  const Partial right = Combine(a, Combine(b, c));
  const Partial shuffled = Combine(Combine(c, a), b);
  for (size_t i = 0; i < left.out.size(); ++i) {
    ASSERT_NEAR(left.out[i], right.out[i], 1e-6f * (1 + std::fabs(left.out[i])));
    ASSERT_NEAR(left.out[i], shuffled.out[i], 1e-6f * (1 + std::fabs(left.out[i])));
  }
  for (size_t i = 0; i < left.lse.size(); ++i) {
    ASSERT_NEAR(left.lse[i], right.lse[i], 1e-6f);
    ASSERT_NEAR(left.lse[i], shuffled.lse[i], 1e-6f);
  }
  EXPECT_TRUE(testing::AllClose(left.out, golden_.out, testing::FlashMlaOutTolerance(1.0), true));
}

TEST(LseCombineEdgeTest, EmptyPartsHaveNoWeight) {
  const std::vector<float> a = {1.0f, 2.0f}, garbage = {std::nanf(""), 1e30f};
  float out[2], lse;
  CombineLse(a.data(), 0.5f, garbage.data(), kNegInf, 2, out, &lse);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(lse, 0.5f);
  CombineLse(garbage.data(), kNegInf, a.data(), 3.0f, 2, out, &lse);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(lse, 3.0f);
  CombineLse(garbage.data(), kNegInf, garbage.data(), kNegInf, 2, out, &lse);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(lse, kNegInf);
}

TEST(LseCombineEdgeTest, EqualWeightsAverageAndAddLnTwo) {
  const std::vector<float> a = {1.0f}, b = {3.0f};
  float out, lse;
  CombineLse(a.data(), 2.0f, b.data(), 2.0f, 1, &out, &lse);
  EXPECT_FLOAT_EQ(out, 2.0f);
  EXPECT_FLOAT_EQ(lse, 2.0f + std::log(2.0f));
}

}  // namespace
}  // namespace mlaserve
