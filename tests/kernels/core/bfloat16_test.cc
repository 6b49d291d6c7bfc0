#include "kernels/core/bfloat16.h"

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve {
namespace {

// Independent reference: the two bf16 neighbours of f by truncation, pick the nearer in
// double arithmetic, ties to the even bit pattern.
uint16_t ReferenceRne(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double x = f;
  const double a = std::bit_cast<float>(static_cast<uint32_t>(lo) << 16);
  const double b = std::bit_cast<float>(static_cast<uint32_t>(hi) << 16);
  const double da = std::fabs(x - a), db = std::fabs(b - x);
  if (da < db) return lo;
  if (db < da) return hi;
  return (lo & 1) == 0 ? lo : hi;
}

TEST(Bf16Test, RoundsToNearestEvenOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0,
                                               0x7f7effffu);  // finite, below the top binade edge
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(bits(rng));
    if (i % 2) f = -f;
    const uint16_t expected = ReferenceRne(std::fabs(f)) | (std::signbit(f) ? 0x8000 : 0);
    ASSERT_EQ(Bf16::FromFloat(f).bits, expected) << "f = " << f;
  }
}

TEST(Bf16Test, TiesGoToEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even is 1.0.
  EXPECT_EQ(Bf16::FromFloat(1.0f + std::ldexp(1.0f, -8)).ToFloat(), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(Bf16::FromFloat(1.0f + 3 * std::ldexp(1.0f, -8)).ToFloat(),
            1.0f + std::ldexp(1.0f, -6));
}

TEST(Bf16Test, SpecialValues) {
  EXPECT_TRUE(std::isnan(Bf16::FromFloat(std::numeric_limits<float>::quiet_NaN()).ToFloat()));
  // A signalling-looking NaN whose payload lives only in the low bits must not become inf.
  EXPECT_TRUE(std::isnan(Bf16::FromFloat(std::bit_cast<float>(0x7f800001u)).ToFloat()));
  EXPECT_EQ(Bf16::FromFloat(std::numeric_limits<float>::infinity()).ToFloat(),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bf16::FromFloat(std::numeric_limits<float>::max()).ToFloat(),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bf16::FromFloat(-0.0f).bits, 0x8000);
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every finite bf16 survives a round trip
    const Bf16 v = Bf16::FromBits(static_cast<uint16_t>(b));
    if (std::isnan(v.ToFloat())) continue;
    ASSERT_EQ(Bf16::FromFloat(v.ToFloat()).bits, b);
  }
}

// Every one of the 65536 patterns against std::isfinite of the value it stands for.
TEST(Bf16Test, IsFiniteAgreesWithTheFloatItStandsFor) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const Bf16 v = Bf16::FromBits(static_cast<uint16_t>(b));
    ASSERT_EQ(v.IsFinite(), std::isfinite(v.ToFloat())) << "bits 0x" << std::hex << b;
  }
}

// Random finite arrays of lengths around the scan's chunk, with zero, one or two non-finite
// words of every kind at random places: the first one's index (std::isfinite scan) or size().
TEST(Bf16Test, FirstNonFiniteFindsTheFirstInfinityOrNaN) {
  std::mt19937 rng(20261123);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffff);
  const uint16_t non_finite[] = {0x7f80, 0xff80, 0x7fc0, 0xffff, 0x7f81};
  for (size_t n : {0u, 1u, 7u, 2047u, 2048u, 2049u, 6000u}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<Bf16> values(n);
      for (Bf16& v : values) {
        do {
          v = Bf16::FromBits(static_cast<uint16_t>(bits(rng)));
        } while (!std::isfinite(v.ToFloat()));
      }
      const int planted = n == 0 ? 0 : trial % 3;
      for (int p = 0; p < planted; ++p) {
        values[rng() % n] = Bf16::FromBits(non_finite[rng() % std::size(non_finite)]);
      }
      size_t expected = n;
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(values[i].ToFloat())) {
          expected = i;
          break;
        }
      }
      ASSERT_EQ(FirstNonFinite(values), expected) << "n " << n << " trial " << trial;
    }
  }
}

}  // namespace
}  // namespace mlaserve
