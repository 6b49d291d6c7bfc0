#include "kernels/core/vector_ops.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve {
namespace {

TEST(VectorOpsTest, RowSumMatchesDoubleSumForEveryLengthRemainder) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (int n : {0, 1, 63, 64, 65, 127, 500, 512}) {
    std::vector<float> x(n);
    double exact = 0.0;
    for (float& v : x) exact += (v = dist(rng));
    EXPECT_NEAR(RowSum(x.data(), n), exact, 1e-6 * (n + 1)) << n;
  }
}

TEST(VectorOpsTest, RowMaxAndExpShiftedHandleMaskedEntries) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {1.0f, -inf, 3.0f, 2.0f};
  EXPECT_EQ(RowMax(x.data(), 4), 3.0f);
  EXPECT_EQ(RowMax(x.data(), 0), -inf);
  std::vector<float> y(4);
  ExpShifted(x.data(), 4, 3.0f, y.data());
  EXPECT_FLOAT_EQ(y[0], std::exp(-2.0f));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 1.0f);
  ExpShifted(x.data(), 4, -inf, y.data());  // no visible key yet
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(VectorOpsTest, ScaleToBf16RoundsTheProduct) {
  const float x[] = {1.0f, 3.0f};
  float y[2];
  ScaleToBf16(x, 2, 1.0f + 1.0f / 512, y);  // 1 + 2^-9 rounds back to 1 in bf16
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 3.0f);
}

}  // namespace
}  // namespace mlaserve
