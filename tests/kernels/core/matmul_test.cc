#include "kernels/core/matmul.h"

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
  // Summing chunk by chunk into C is the defined semantics: compute the same thing by hand.
  std::mt19937 rng(3);
  const int m = 4, n = 5, k = 192;
  const auto a = RandomBf16Values(m * k, rng);
  const auto b = RandomBf16Values(n * k, rng);
  std::vector<float> whole(m * n), by_hand(m * n, 0.0f), part(m * n);
  MatmulNT(m, n, k, a.data(), k, b.data(), k, whole.data(), n, false, 96);
  for (int k0 = 0; k0 < k; k0 += 96) {
    MatmulNT(m, n, 96, a.data() + k0, k, b.data() + k0, k, part.data(), n, false, 0);
    for (int i = 0; i < m * n; ++i) by_hand[i] += part[i];
  }
  EXPECT_EQ(whole, by_hand);
}

}  // namespace
}  // namespace mlaserve
