#include "kernels/core/float8_e4m3.h"

#include <cmath>

namespace mlaserve {
namespace {

constexpr uint8_t kNanBits = 0x7f;
constexpr uint8_t kMaxFiniteBits = 0x7e;  // 0.1111.110 = 1.75 * 2^8 = 448
constexpr int kBias = 7;
constexpr int kMinNormalExponent = -6;

}  // namespace

Fp8E4m3 Fp8E4m3::FromFloat(float f) {
  if (std::isnan(f)) return Fp8E4m3{kNanBits};
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= kMax) return Fp8E4m3{static_cast<uint8_t>(sign | kMaxFiniteBits)};

  int exponent = 0;
  std::frexp(a, &exponent);  // a = frac * 2^exponent, frac in [0.5, 1)
  --exponent;                // now a = (1.m) * 2^exponent
  if (a == 0.0f || exponent < kMinNormalExponent) {
    // Subnormal range: multiples of 2^-9. nearbyint rounds half to even (default mode).
    const int q = static_cast<int>(std::nearbyint(std::ldexp(a, 9)));
    // q == 8 is exactly the smallest normal, whose encoding 0.0001.000 is also 8.
    return Fp8E4m3{static_cast<uint8_t>(sign | q)};
  }
  int mantissa = static_cast<int>(std::nearbyint((std::ldexp(a, -exponent) - 1.0f) * 8.0f));
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  const int biased = exponent + kBias;
  if (biased > 15 || (biased == 15 && mantissa == 7)) {
    return Fp8E4m3{static_cast<uint8_t>(sign | kMaxFiniteBits)};
  }
  return Fp8E4m3{static_cast<uint8_t>(sign | (biased << 3) | mantissa)};
}

float Fp8E4m3::ToFloat() const {
  const bool negative = (bits & 0x80) != 0;
  const int biased = (bits >> 3) & 0x0f;
  const int mantissa = bits & 0x07;
  if (biased == 15 && mantissa == 7) return std::nanf("");
  float magnitude = biased == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                : std::ldexp(1.0f + mantissa / 8.0f, biased - kBias);
  return negative ? -magnitude : magnitude;
}

}  // namespace mlaserve
