#include "kernels/core/float16.h"

#include <cmath>

#include "gtest/gtest.h"

namespace mlaserve {
namespace {

TEST(Fp16Test, EveryValueRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const Fp16 v = Fp16::FromBits(static_cast<uint16_t>(b));
    if (std::isnan(v.ToFloat())) continue;
    ASSERT_EQ(Fp16::FromFloat(v.ToFloat()).bits, b);
  }
}

TEST(Fp16Test, RoundsHalfToEvenAndOverflowsToInfinity) {
  EXPECT_EQ(Fp16::FromFloat(1.0f + std::ldexp(1.0f, -11)).ToFloat(), 1.0f);
  EXPECT_EQ(Fp16::FromFloat(1.0f + 3 * std::ldexp(1.0f, -11)).ToFloat(),
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp16::FromFloat(65504.0f).ToFloat(), 65504.0f);
  EXPECT_TRUE(std::isinf(Fp16::FromFloat(70000.0f).ToFloat()));
  EXPECT_EQ(Fp16::FromFloat(std::ldexp(1.0f, -24)).ToFloat(), std::ldexp(1.0f, -24));  // subnormal
}

}  // namespace
}  // namespace mlaserve
