#ifndef MLASERVE_KERNELS_CORE_FLOAT16_H_
#define MLASERVE_KERNELS_CORE_FLOAT16_H_

#include <bit>
#include <cstdint>

#if defined(__clang__) && __clang_major__ < 15
#include <immintrin.h>
#define MLASERVE_FP16_VIA_F16C 1
#endif

namespace mlaserve {

// IEEE binary16. Conversions go through the compiler's _Float16 (F16C / AVX512-FP16 on x86),
// which rounds to nearest even and handles subnormals, inf and NaN per IEEE 754.
struct Fp16 {
  uint16_t bits = 0;

  static constexpr Fp16 FromBits(uint16_t b) { return Fp16{b}; }
#ifdef MLASERVE_FP16_VIA_F16C
  // clang 14 (the asan preset's compiler) has no _Float16 on x86: F16C's conversions, which
  // round the same way (every AVX2 CPU has F16C).
  __attribute__((target("f16c"))) static Fp16 FromFloat(float f) {
    const __m128i h = _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT);
    return Fp16{static_cast<uint16_t>(_mm_cvtsi128_si32(h) & 0xffff)};
  }
  __attribute__((target("f16c"))) float ToFloat() const {
    return _cvtsh_ss(static_cast<unsigned short>(bits));
  }
#else
  static Fp16 FromFloat(float f) { return Fp16{std::bit_cast<uint16_t>(static_cast<_Float16>(f))}; }
  float ToFloat() const { return static_cast<float>(std::bit_cast<_Float16>(bits)); }
#endif

  friend constexpr bool operator==(Fp16 a, Fp16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(Fp16) == 2);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_FLOAT16_H_
