#include "kernels/reference/golden_attention.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/random_batch.h"

namespace mlaserve {
namespace {

// The golden itself is checked against the textbook formula evaluated term by term, with
// no GEMM and no max-subtraction, on a case small enough for that to be exact in fp64.
TEST(GoldenAttentionTest, MatchesTextbookSoftmaxOnSmallCase) {
  std::mt19937 rng(4);
  std::normal_distribution<double> dist(0.0, 1.0);
  const int rows = 3, n = 7, dk = 5, dv = 4;
  std::vector<double> q(rows * dk), k(n * dk), v(n * dv);
  for (auto* vec : {&q, &k, &v})
    for (double& x : *vec) x = dist(rng);
  const std::vector<int32_t> visible = {7, 3, 0};
  const double scale = 0.7;
  const GoldenOutput g = GoldenAttentionRows(q, rows, dk, k, v, n, dv, visible, scale);
  for (int i = 0; i < rows; ++i) {
    if (visible[i] == 0) {
      EXPECT_EQ(g.lse[i], -std::numeric_limits<double>::infinity());
      for (int d = 0; d < dv; ++d) EXPECT_EQ(g.out[i * dv + d], 0.0);
      continue;
    }
    double denom = 0;
    std::vector<double> num(dv, 0.0);
    for (int j = 0; j < visible[i]; ++j) {
      double s = 0;
      for (int d = 0; d < dk; ++d) s += q[i * dk + d] * k[j * dk + d];
      const double w = std::exp(s * scale);
      denom += w;
      for (int d = 0; d < dv; ++d) num[d] += w * v[j * dv + d];
    }
    EXPECT_NEAR(g.lse[i], std::log(denom), 1e-12);
    for (int d = 0; d < dv; ++d) EXPECT_NEAR(g.out[i * dv + d], num[d] / denom, 1e-12);
  }
}

TEST(GoldenAttentionTest, LatentDecodeAppliesTheBottomRightCausalMask) {
  Rng rng(9);
  auto batch = testing::MakeRandomPagedBatch(
      {.sq = 3, .heads = 2, .dk = 8, .page_size = 4, .seqlens = {5}}, rng);
  const auto causal = GoldenLatentDecode(batch.Latent(8, 0.5f, /*causal=*/true));
  const auto full = GoldenLatentDecode(batch.Latent(8, 0.5f, /*causal=*/false));
  ASSERT_TRUE(causal.ok() && full.ok());
  // The last query token sees everything, the first sees 3 of 5 keys.
  for (int h = 0; h < 2; ++h) {
    EXPECT_DOUBLE_EQ(causal->lse[2 * 2 + h], full->lse[2 * 2 + h]);
    EXPECT_NE(causal->lse[0 * 2 + h], full->lse[0 * 2 + h]);
  }
}

}  // namespace
}  // namespace mlaserve
