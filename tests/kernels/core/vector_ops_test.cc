#include "kernels/core/vector_ops.h"

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/bfloat16.h"

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

TEST(VectorOpsTest, NarrowToBf16IsFromFloatOnEveryKindOfWord) {
  // Exact bf16 values, ties to even, values between, infinities, zeros, subnormals, NaNs.
  std::mt19937 rng(21);
  std::uniform_int_distribution<uint32_t> any_word;
  std::vector<float> in = {0.0f,
                           -0.0f,
                           1.0f,
                           -2.5f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::nanf(""),
                           std::bit_cast<float>(0x3f808000u),
                           std::bit_cast<float>(0x3f818000u),
                           std::bit_cast<float>(0x7f7fffffu),
                           std::bit_cast<float>(0x00000001u),
                           std::bit_cast<float>(0xffc00001u)};
  while (in.size() < 5000) in.push_back(std::bit_cast<float>(any_word(rng)));
  std::vector<Bf16> out(in.size());
  NarrowToBf16(in.data(), static_cast<int64_t>(in.size()), out.data());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i].bits, Bf16::FromFloat(in[i]).bits)
        << "word 0x" << std::hex << std::bit_cast<uint32_t>(in[i]);
  }
}

}  // namespace
}  // namespace mlaserve
