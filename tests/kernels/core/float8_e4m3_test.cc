#include "kernels/core/float8_e4m3.h"

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/bfloat16.h"

namespace mlaserve {
namespace {

// Brute force over the whole code table: nearest finite value, ties to the even code.
uint8_t ReferenceEncode(float f) {
  if (std::isnan(f)) return 0x7f;
  float best_dist = std::numeric_limits<float>::infinity();
  int best = -1;
  for (int code = 0; code < 256; ++code) {
    const float v = Fp8E4m3::FromBits(static_cast<uint8_t>(code)).ToFloat();
    if (std::isnan(v)) continue;
    if ((code & 0x80) != (std::signbit(f) ? 0x80 : 0)) continue;
    const float d = std::fabs(static_cast<double>(v) - f);
    if (d < best_dist || (d == best_dist && (code & 1) == 0)) {
      best_dist = d;
      best = code;
    }
  }
  return static_cast<uint8_t>(best);
}

// The OCP table from its definition, independent of the code under test.
double ReferenceDecode(int code) {
  const int exponent = (code >> 3) & 0x0f;
  const int mantissa = code & 0x07;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

TEST(Fp8E4m3Test, WidensEveryCodeExactlyToBf16) {
  std::vector<Fp8E4m3> codes(256);
  for (int code = 0; code < 256; ++code)
    codes[code] = Fp8E4m3::FromBits(static_cast<uint8_t>(code));
  std::vector<Bf16> widened(256);
  WidenFp8ToBf16(codes.data(), 256, widened.data());
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(widened[code].ToFloat())) << code;
      continue;
    }
    EXPECT_EQ(static_cast<double>(widened[code].ToFloat()), ReferenceDecode(code)) << code;
    EXPECT_EQ(widened[code], codes[code].ToBf16()) << code;
  }
}

TEST(Fp8E4m3Test, DecodesTheOcpTable) {
  EXPECT_EQ(Fp8E4m3::FromBits(0x7e).ToFloat(), 448.0f);
  EXPECT_EQ(Fp8E4m3::FromBits(0x08).ToFloat(), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(Fp8E4m3::FromBits(0x01).ToFloat(), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4m3::FromBits(0x38).ToFloat(), 1.0f);
  EXPECT_TRUE(std::isnan(Fp8E4m3::FromBits(0x7f).ToFloat()));
  EXPECT_TRUE(std::isnan(Fp8E4m3::FromBits(0xff).ToFloat()));
  float previous = -1.0f;
  for (int code = 0; code < 0x7f; ++code) {  // positive codes are monotone
    const float v = Fp8E4m3::FromBits(static_cast<uint8_t>(code)).ToFloat();
    ASSERT_GT(v, previous) << code;
    previous = v;
  }
}

TEST(Fp8E4m3Test, EncodesNearestEvenAgainstBruteForce) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mag(-10.0f, 9.0f);
  std::vector<float> samples;
  for (int i = 0; i < 20000; ++i) {
    const float v = std::exp2(mag(rng));
    samples.push_back(i % 2 ? v : -v);
  }
  for (int code = 0; code < 0x7e; ++code) {  // exact midpoints between neighbours
    const float a = Fp8E4m3::FromBits(static_cast<uint8_t>(code)).ToFloat();
    const float b = Fp8E4m3::FromBits(static_cast<uint8_t>(code + 1)).ToFloat();
    samples.push_back((a + b) / 2);
    samples.push_back(-(a + b) / 2);
  }
  for (float f : samples) {
    if (std::fabs(f) >= 448.0f) continue;
    ASSERT_EQ(Fp8E4m3::FromFloat(f).bits, ReferenceEncode(f)) << "f = " << f;
  }
}

TEST(Fp8E4m3Test, EncodesRandomBitPatternsAndRowsLikeTheScalarForm) {
  // Arbitrary fp32 words (every exponent, subnormals, NaN payloads) through the row form.
  std::mt19937 rng(std::random_device{}());
  std::vector<float> values(50000);
  for (float& v : values) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  for (int i = 0; i < 20000; ++i) {  // and dense coverage of the range that matters
    values.push_back(
        std::ldexp(static_cast<float>(rng() % 4096) - 2048.0f, -static_cast<int>(rng() % 24)));
  }
  std::vector<Fp8E4m3> row(values.size());
  NarrowToFp8(values.data(), static_cast<int64_t>(values.size()), row.data());
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = values[i];
    ASSERT_EQ(row[i], Fp8E4m3::FromFloat(f)) << f;
    if (std::isnan(f)) {
      ASSERT_EQ(row[i].bits, 0x7f) << f;
    } else if (std::fabs(f) >= 448.0f) {
      ASSERT_EQ(row[i].bits & 0x7f, 0x7e) << f;
    } else {
      ASSERT_EQ(row[i].bits, ReferenceEncode(f)) << "f = " << f;
    }
  }
}

TEST(Fp8E4m3Test, Saturates) {
  EXPECT_EQ(Fp8E4m3::FromFloat(449.0f).ToFloat(), 448.0f);
  EXPECT_EQ(Fp8E4m3::FromFloat(1e9f).ToFloat(), 448.0f);
  EXPECT_EQ(Fp8E4m3::FromFloat(-std::numeric_limits<float>::infinity()).ToFloat(), -448.0f);
  EXPECT_EQ(Fp8E4m3::FromFloat(0.0f).bits, 0x00);
  EXPECT_EQ(Fp8E4m3::FromFloat(-0.0f).bits, 0x80);
  EXPECT_TRUE(std::isnan(Fp8E4m3::FromFloat(std::nanf("")).ToFloat()));
}

}  // namespace
}  // namespace mlaserve
