#ifndef MLASERVE_KERNELS_CORE_FLOAT8_E4M3_H_
#define MLASERVE_KERNELS_CORE_FLOAT8_E4M3_H_

#include <bit>
#include <cstdint>

#include "kernels/core/bfloat16.h"

namespace mlaserve {

// OCP FP8 E4M3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities,
// S.1111.111 is NaN, largest finite value 448, smallest subnormal 2^-9.
struct Fp8E4m3 {
  uint8_t bits = 0;

  static constexpr float kMax = 448.0f;

  static constexpr Fp8E4m3 FromBits(uint8_t b) { return Fp8E4m3{b}; }

  // Round-to-nearest-even and *saturating*: finite values beyond +-448 (and +-inf) become
  // +-448, as KV-cache quantisers expect; NaN maps to NaN. Integer and exact-float steps only,
  // so loops over it vectorise (the KV append and the kernels' P quantisation run it per value).
  static constexpr Fp8E4m3 FromFloat(float f) {
    const uint32_t word = std::bit_cast<uint32_t>(f);
    const auto sign = static_cast<uint8_t>((word >> 24) & 0x80u);
    const uint32_t magnitude = word & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return Fp8E4m3{0x7f};                                // NaN
    if (magnitude >= 0x43e00000u) return Fp8E4m3{static_cast<uint8_t>(sign | 0x7e)};  // >= 448
    if (magnitude < 0x3c800000u) {  // below 2^-6: subnormal codes are multiples of 2^-9
      // a * 2^9 is exact and below 8; adding and removing 2^23 rounds it to nearest even.
      const float scaled = std::bit_cast<float>(magnitude) * 512.0f;
      const float rounded = (scaled + 8388608.0f) - 8388608.0f;
      return Fp8E4m3{static_cast<uint8_t>(sign | static_cast<uint8_t>(rounded))};
    }
    // Normal: keep 3 of the 23 mantissa bits, nearest even. Nothing below 448 rounds past it
    // (432, the midpoint to 448, ties to 448's even code), so no overflow check is needed.
    const uint32_t rounded = magnitude + 0x7ffffu + ((magnitude >> 20) & 1u);
    const uint32_t exponent = (rounded >> 23) - 127u + 7u;
    const uint32_t mantissa = (rounded >> 20) & 7u;
    return Fp8E4m3{static_cast<uint8_t>(sign | (exponent << 3) | mantissa)};
  }

  // Every e4m3 value is a bf16 value (3 mantissa bits, exponents 2^-9..2^8), so this is exact:
  // a matrix unit that takes bf16 operands multiplies fp8 values without error.
  constexpr Bf16 ToBf16() const {
    const auto sign = static_cast<uint16_t>((bits & 0x80u) << 8);
    const int exponent = (bits >> 3) & 0x0f;
    const int mantissa = bits & 0x07;
    if (exponent == 15 && mantissa == 7) return Bf16{static_cast<uint16_t>(sign | 0x7fc0u)};
    if (exponent == 0) {
      if (mantissa == 0) return Bf16{sign};
      const int top = std::bit_width(static_cast<unsigned>(mantissa)) - 1;  // 0..2
      const auto fraction = static_cast<uint16_t>((mantissa << (7 - top)) & 0x7f);
      return Bf16{static_cast<uint16_t>(sign | ((top - 9 + 127) << 7) | fraction)};
    }
    return Bf16{static_cast<uint16_t>(sign | ((exponent + 120) << 7) | (mantissa << 4))};
  }

  constexpr float ToFloat() const { return ToBf16().ToFloat(); }

  friend constexpr bool operator==(Fp8E4m3 a, Fp8E4m3 b) { return a.bits == b.bits; }
};

static_assert(sizeof(Fp8E4m3) == 1);

// out[j] = e4m3(in[j]) (Fp8E4m3::FromFloat), vectorised.
void NarrowToFp8(const float* in, int64_t n, Fp8E4m3* out);

// out[j] = in[j] as bf16 (exact), through a 256-entry table.
void WidenFp8ToBf16(const Fp8E4m3* in, int64_t n, Bf16* out);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_FLOAT8_E4M3_H_
