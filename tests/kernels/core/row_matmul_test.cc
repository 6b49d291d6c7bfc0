#include "kernels/core/row_matmul.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/bfloat16.h"

namespace mlaserve {
namespace {

std::vector<Bf16> RandomBf16(int n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<Bf16> v(n);
  for (Bf16& x : v) x = Bf16::FromFloat(dist(rng));
  return v;
}

std::vector<float> RandomStart(int n, std::mt19937& rng) {
  std::vector<float> c(n);
  for (float& x : c) x = RandomBf16(1, rng)[0].ToFloat();
  return c;
}

// The header's definition written out scalar, independent of the kernels' vector code: each
// product is exact in fp32, so each float addition rounds once, as the definition says.
void DefinitionNN(int m, int n, int k, const Bf16* a, const Bf16* b, float* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float sum = c[i * ldc + j];
      for (int t = 0; t < k; ++t) {
        sum += a[i * k + t].ToFloat() * b[t * n + j].ToFloat();
      }
      c[i * ldc + j] = sum;
    }
  }
}

// Every row count the kernel takes, widths with and without partial vectors: its bits are the
// definition's, and the definition is within fp32 rounding of the exact product.
TEST(RowMatmulTest, NNIsItsDefinitionBitForBit) {
  std::mt19937 rng(11);
  for (int m = 1; m <= kRowMatmulRows; ++m) {
    for (const auto& [n, k] : {std::pair{128, 128}, std::pair{72, 100}, std::pair{5, 3}}) {
      const auto a = RandomBf16(m * k, rng), b = RandomBf16(k * n, rng);
      const auto c0 = RandomStart(m * 128, rng);
      std::vector<float> got = c0, want = c0;
      RowMatmulNN(m, n, k, a.data(), b.data(), got.data(), 128);
      DefinitionNN(m, n, k, a.data(), b.data(), want.data(), 128);
      ASSERT_EQ(got, want) << "m " << m << " n " << n << " k " << k;
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double exact = c0[i * 128 + j];
          for (int t = 0; t < k; ++t)
            exact += double(a[i * k + t].ToFloat()) * b[t * n + j].ToFloat();
          ASSERT_NEAR(got[i * 128 + j], exact, 2e-5 * k) << i << "," << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace mlaserve
