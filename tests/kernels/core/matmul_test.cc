#include "kernels/core/matmul.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/bfloat16.h"

namespace mlaserve {
namespace {

std::vector<float> RandomBf16Values(int n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = RoundToBf16(dist(rng));
  return v;
}

TEST(MatmulTest, ChunkedNTMatchesDoubleProduct) {
  std::mt19937 rng(1);
  const int m = 37, n = 53, k = 200;
  const auto a = RandomBf16Values(m * k, rng);
  const auto b = RandomBf16Values(n * k, rng);
  std::vector<float> c(m * n, 123.0f);
  MatmulNT(m, n, k, a.data(), k, b.data(), k, c.data(), n, /*accumulate=*/false, 96);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double exact = 0;
      for (int t = 0; t < k; ++t) exact += double(a[i * k + t]) * b[j * k + t];
      ASSERT_NEAR(c[i * n + j], exact, 1e-4 * std::sqrt(k)) << i << "," << j;
    }
  }
}

TEST(MatmulTest, AccumulateAddsToExistingValuesAndNNMatches) {
  std::mt19937 rng(2);
  const int m = 9, n = 17, k = 130;
  const auto a = RandomBf16Values(m * k, rng);
  const auto b = RandomBf16Values(k * n, rng);
  std::vector<float> c(m * n, 2.0f);
  MatmulNN(m, n, k, a.data(), k, b.data(), n, c.data(), n, /*accumulate=*/true, 128);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double exact = 2.0;
      for (int t = 0; t < k; ++t) exact += double(a[i * k + t]) * b[t * n + j];
      ASSERT_NEAR(c[i * n + j], exact, 1e-4 * std::sqrt(k));
    }
  }
}

TEST(MatmulTest, ChunkOrderIsTheDefinedOne) {
  // One kernel call per (tile, chunk), each accumulating into C in chunk order: compute the
  // same thing call by call.
  std::mt19937 rng(3);
  const int m = 130, n = 5, k = 192;
  const auto a = RandomBf16Values(m * k, rng);
  const auto b = RandomBf16Values(k * n, rng);
  std::vector<float> whole(m * n), by_hand(m * n, 0.0f);
  MatmulNN(m, n, k, a.data(), k, b.data(), n, whole.data(), n, false, 96);
  for (int i = 0; i < m; i += kMatrixTile) {
    for (int k0 = 0; k0 < k; k0 += 96) {
      MatmulTile(std::min(kMatrixTile, m - i), n, 96, a.data() + i * k + k0, k, b.data() + k0 * n, n,
                 by_hand.data() + i * n, n);
    }
  }
  EXPECT_EQ(whole, by_hand);
}

TEST(MatmulTest, NTIsFormedTransposedFromTheSameCalls) {
  // C^T = B A^T per tile and chunk (what the emulated cube does with A^T in L1): the same
  // bits as MatmulNT, including when accumulating.
  std::mt19937 rng(4);
  const int m = 128, n = 65, k = 576;
  const auto a = RandomBf16Values(m * k, rng);
  const auto b = RandomBf16Values(n * k, rng);
  const auto c0 = RandomBf16Values(m * n, rng);
  std::vector<float> nt = c0;
  MatmulNT(m, n, k, a.data(), k, b.data(), k, nt.data(), n, /*accumulate=*/true, 96);
  std::vector<float> a_t(k * m), c_t(n * kMatrixTile), by_hand(m * n);
  Transpose(m, k, a.data(), k, a_t.data(), m);
  Transpose(m, n, c0.data(), n, c_t.data(), kMatrixTile);
  for (int k0 = 0; k0 < k; k0 += 96) {
    MatmulTile(n, m, 96, b.data() + k0, k, a_t.data() + k0 * m, m, c_t.data(), kMatrixTile);
  }
  Transpose(n, m, c_t.data(), kMatrixTile, by_hand.data(), n);
  EXPECT_EQ(nt, by_hand);
}

TEST(MatmulTest, TransposeWritesInTransposedWithBothStrides) {
  std::mt19937 rng(6);
  const int rows = 37, cols = 130, ldi = 133, ldo = 41;
  const auto in = RandomBf16Values(rows * ldi, rng);
  std::vector<float> out(cols * ldo, -7.0f);
  Transpose(rows, cols, in.data(), ldi, out.data(), ldo);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) ASSERT_EQ(out[c * ldo + r], in[r * ldi + c]) << r << "," << c;
  }
  for (int c = 0; c < cols; ++c) {
    for (int r = rows; r < ldo; ++r) ASSERT_EQ(out[c * ldo + r], -7.0f) << "padding written at " << c << "," << r;
  }
}

}  // namespace
}  // namespace mlaserve
