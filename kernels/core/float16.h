#ifndef MLASERVE_KERNELS_CORE_FLOAT16_H_
#define MLASERVE_KERNELS_CORE_FLOAT16_H_

#include <bit>
#include <cstdint>

namespace mlaserve {

// IEEE binary16. Conversions go through the compiler's _Float16 (F16C / AVX512-FP16 on x86),
// which rounds to nearest even and handles subnormals, inf and NaN per IEEE 754.
struct Fp16 {
  uint16_t bits = 0;

  static constexpr Fp16 FromBits(uint16_t b) { return Fp16{b}; }
  static Fp16 FromFloat(float f) { return Fp16{std::bit_cast<uint16_t>(static_cast<_Float16>(f))}; }
  float ToFloat() const { return static_cast<float>(std::bit_cast<_Float16>(bits)); }

  friend constexpr bool operator==(Fp16 a, Fp16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(Fp16) == 2);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_FLOAT16_H_
