#ifndef MLASERVE_KERNELS_CORE_FLOAT8_E4M3_H_
#define MLASERVE_KERNELS_CORE_FLOAT8_E4M3_H_

#include <cstdint>

namespace mlaserve {

// OCP FP8 E4M3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities,
// S.1111.111 is NaN, largest finite value 448, smallest subnormal 2^-9.
struct Fp8E4m3 {
  uint8_t bits = 0;

  static constexpr float kMax = 448.0f;

  static constexpr Fp8E4m3 FromBits(uint8_t b) { return Fp8E4m3{b}; }
  // Round-to-nearest-even and *saturating*: finite values beyond +-448 (and +-inf) become
  // +-448, as KV-cache quantisers expect; NaN maps to NaN.
  static Fp8E4m3 FromFloat(float f);
  float ToFloat() const;

  friend constexpr bool operator==(Fp8E4m3 a, Fp8E4m3 b) { return a.bits == b.bits; }
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_FLOAT8_E4M3_H_
