#ifndef MLASERVE_KERNELS_CORE_BFLOAT16_H_
#define MLASERVE_KERNELS_CORE_BFLOAT16_H_

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

namespace mlaserve {

// bfloat16: the top half of an IEEE fp32 word. Storage type for activations and the KV cache.
struct Bf16 {
  uint16_t bits = 0;

  static constexpr Bf16 FromBits(uint16_t b) { return Bf16{b}; }

  // Round-to-nearest-even, the rounding every matrix/vector unit in this project assumes.
  // NaN stays NaN (quieted); overflow rounds to +-inf as IEEE requires.
  static constexpr Bf16 FromFloat(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return Bf16{static_cast<uint16_t>(u >> 16)};
  }

  constexpr float ToFloat() const {
    return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  }

  // False for infinities and NaN (the exponent field all ones).
  constexpr bool IsFinite() const { return (bits & 0x7f80u) != 0x7f80u; }

  friend constexpr bool operator==(Bf16 a, Bf16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(Bf16) == 2);

// Index of the first infinity or NaN in `values`, or values.size() when every value is finite.
// Validation runs this over every query byte of every Decode, so each chunk is first counted
// by a branch-free loop the compiler vectorises; only a chunk with a hit is searched.
inline size_t FirstNonFinite(std::span<const Bf16> values) {
  constexpr size_t kChunk = 2048;
  for (size_t begin = 0; begin < values.size(); begin += kChunk) {
    const size_t end = std::min(values.size(), begin + kChunk);
    uint32_t hits = 0;
    for (size_t i = begin; i < end; ++i) hits += (values[i].bits & 0x7f80u) == 0x7f80u;
    if (hits == 0) continue;
    for (size_t i = begin; i < end; ++i) {
      if (!values[i].IsFinite()) return i;
    }
  }
  return values.size();
}

// The value f takes after a round trip through bf16: how the matrix unit sees an fp32 operand.
constexpr float RoundToBf16(float f) { return Bf16::FromFloat(f).ToFloat(); }

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_BFLOAT16_H_
