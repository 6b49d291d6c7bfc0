#include "kernels/core/fp32_exponent_add.h"

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve {
namespace {

int ExponentField(float f) { return (std::bit_cast<uint32_t>(f) >> 23) & 0xff; }

// Lemma 3.1: F * 2^n == AS_FP32(AS_INT32(F) + n * 2^23) for normal F and 0 < E + n < 255.
TEST(Fp32ExponentAddTest, IntegerAddEqualsPowerOfTwoMultiplyInsideTheLemmaDomain) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits(0x00800000u, 0x7f7fffffu);  // positive normals
  std::uniform_int_distribution<int> shift(-126, 126);
  int checked = 0;
  for (int i = 0; i < 500000; ++i) {
    const uint32_t word = bits(rng) | (i % 2 ? 0x80000000u : 0);
    const float f = std::bit_cast<float>(word);
    const int n = shift(rng);
    const int e = ExponentField(f);
    if (!(0 < e + n && e + n < 255)) continue;
    const float expected = std::ldexp(f, n);
    const int32_t delta = n * (1 << 23);
    ASSERT_EQ(std::bit_cast<uint32_t>(expected), RawInt32Add(word, delta)) << f << " * 2^" << n;
    ASSERT_EQ(std::bit_cast<uint32_t>(expected),
              std::bit_cast<uint32_t>(AddToExponentField(f, delta)));
    ++checked;
  }
  EXPECT_GT(checked, 100000);
}

TEST(Fp32ExponentAddTest, SignIsPreserved) {
  EXPECT_EQ(AddToExponentField(-3.0f, -1 << 23), -1.5f);
  EXPECT_EQ(AddToExponentField(3.0f, 2 << 23), 12.0f);
}

TEST(Fp32ExponentAddTest, ZerosStaySignedZeroWhereTheRawAddWouldCorruptThem) {
  const int32_t down = -1 << 23;
  // The hardware's raw add turns +0 into -inf and -0 into +inf; AMLA must not.
  EXPECT_TRUE(std::isinf(std::bit_cast<float>(RawInt32Add(std::bit_cast<uint32_t>(0.0f), down))));
  EXPECT_TRUE(std::isinf(std::bit_cast<float>(RawInt32Add(std::bit_cast<uint32_t>(-0.0f), down))));
  EXPECT_EQ(std::bit_cast<uint32_t>(AddToExponentField(0.0f, down)), 0x00000000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(AddToExponentField(-0.0f, down)), 0x80000000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(AddToExponentField(0.0f, 5 << 23)), 0x00000000u);
}

TEST(Fp32ExponentAddTest, SubnormalsFlushAndUnderflowGoesToZero) {
  const float subnormal = std::numeric_limits<float>::denorm_min() * 1000;
  EXPECT_EQ(AddToExponentField(subnormal, 3 << 23), 0.0f);
  const float tiny = std::ldexp(1.0f, -120);                              // E = 7
  EXPECT_EQ(AddToExponentField(tiny, -6 << 23), std::ldexp(1.0f, -126));  // E = 1: still normal
  EXPECT_EQ(std::bit_cast<uint32_t>(AddToExponentField(tiny, -7 << 23)), 0u);
  EXPECT_EQ(std::bit_cast<uint32_t>(AddToExponentField(-tiny, -30 << 23)), 0x80000000u);
}

TEST(Fp32ExponentAddTest, OverflowSaturatesToInfinityAndSpecialsPassThrough) {
  const float big = std::ldexp(1.0f, 120);
  EXPECT_EQ(AddToExponentField(big, 7 << 23), std::ldexp(1.0f, 127));
  EXPECT_EQ(AddToExponentField(big, 8 << 23), std::numeric_limits<float>::infinity());
  EXPECT_EQ(AddToExponentField(-big, 8 << 23), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(AddToExponentField(std::numeric_limits<float>::infinity(), -5 << 23),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(AddToExponentField(std::nanf(""), -5 << 23)));
}

TEST(Fp32ExponentAddTest, MantissaCorrectionApproximatesSmallMultiplies) {
  // AMLA folds (1 + eps) into the add as round(1.5 * 2^23 * eps): exact at mantissa 0.5,
  // within |eps| * 0.5 relative elsewhere.
  const float eps = 1.0f / 300;
  const auto fix = static_cast<int32_t>(std::nearbyint(1.5f * eps * 8388608.0f));
  for (float f : {1.0f, 1.25f, 1.5f, 1.75f, 1.999f}) {
    const float approx = AddToExponentField(f, fix);
    EXPECT_NEAR(approx / (f * (1 + eps)), 1.0, 0.5 * eps + 1e-6) << f;
  }
  EXPECT_NEAR(AddToExponentField(1.5f, fix), 1.5f * (1 + eps), 1e-6);
}

TEST(Fp32ExponentAddTest, RowFormEqualsTheScalarFormOnEveryKindOfWordAndDelta) {
  // Normals, zeros, subnormals, infinities and NaNs of both signs, against deltas from
  // tiny mantissa corrections to shifts past the whole exponent range and int32's ends.
  std::mt19937 rng(12);
  std::uniform_int_distribution<uint32_t> any_word;
  const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu,
                            0x00800000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
                            0x7fc00001u, 0xffc00000u, 0x3f800000u, 0xbf800000u};
  const int32_t deltas[] = {0,         1,         -1,        1 << 23,    -(1 << 23),
                            37 << 23,  -37 << 23, 254 << 23, -254 << 23, (5 << 23) + 77,
                            INT32_MAX, INT32_MIN};
  std::vector<float> row(4096);
  for (size_t i = 0; i < row.size(); ++i) {
    row[i] = std::bit_cast<float>(i < std::size(edges) ? edges[i] : any_word(rng));
  }
  for (int32_t delta : deltas) {
    std::vector<float> got = row;
    AddToExponentFieldRow(got.data(), static_cast<int64_t>(got.size()), delta);
    for (size_t i = 0; i < row.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]),
                std::bit_cast<uint32_t>(AddToExponentField(row[i], delta)))
          << "word 0x" << std::hex << std::bit_cast<uint32_t>(row[i]) << " delta " << std::dec
          << delta;
    }
  }
}

}  // namespace
}  // namespace mlaserve
