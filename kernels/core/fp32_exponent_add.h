#ifndef MLASERVE_KERNELS_CORE_FP32_EXPONENT_ADD_H_
#define MLASERVE_KERNELS_CORE_FP32_EXPONENT_ADD_H_

#include <algorithm>
#include <bit>
#include <cstdint>

namespace mlaserve {

// AMLA's "multiply by adding" (AMLA paper, Lemma 3.1): for a normal fp32 F with exponent
// field E and an integer n with 0 < E + n < 255,
//     F * 2^n  ==  AS_FP32(AS_INT32(F) + n * 2^23)        (bit for bit).
// AMLA folds a small mantissa correction into the same add (delta is not always a multiple
// of 2^23), so in general delta = n * 2^23 + k with |k| << 2^23.

// The raw operation an int32 atomic add into global memory performs. Unsigned arithmetic
// because the hardware wraps where C++ signed overflow would be undefined.
constexpr uint32_t RawInt32Add(uint32_t word, int32_t delta) {
  return word + static_cast<uint32_t>(delta);
}

// The same add with the edges defined, which is what mlaserve's AMLA kernels use:
//  * +-0 and subnormals are left as signed zero (the raw add would turn +0 with n < 0 into
//    -inf/NaN, and -0 into +inf; the hardware flushes fp32 subnormals anyway);
//  * a result below the smallest normal (exponent underflow) becomes signed zero;
//  * a result past the largest finite value becomes signed infinity;
//  * inf and NaN are left unchanged;
//  * the sign bit is never touched.
// Inside the lemma's domain it equals RawInt32Add bit for bit.
constexpr uint32_t AddToExponentField(uint32_t word, int32_t delta) {
  constexpr uint32_t kSign = 0x80000000u;
  constexpr int64_t kMinNormal = 0x00800000;
  constexpr int64_t kInf = 0x7f800000;
  const uint32_t sign = word & kSign;
  const int64_t magnitude = word & ~kSign;
  if (magnitude >= kInf) return word;       // inf, NaN
  if (magnitude < kMinNormal) return sign;  // zero, subnormal
  const int64_t scaled = magnitude + delta;
  if (scaled < kMinNormal) return sign;                           // underflow
  if (scaled >= kInf) return sign | static_cast<uint32_t>(kInf);  // overflow
  return sign | static_cast<uint32_t>(scaled);
}

inline float AddToExponentField(float value, int32_t delta) {
  return std::bit_cast<float>(AddToExponentField(std::bit_cast<uint32_t>(value), delta));
}

// AddToExponentField over a row that shares one delta (AMLA's per-row rescale), bit for bit
// the same. The under/overflow limits are worked out once for the row, so the per-element
// work is 32-bit compares and selects the compiler vectorises (the scalar form's 64-bit
// arithmetic and branches do not).
inline void AddToExponentFieldRow(float* row, int64_t n, int32_t delta) {
  constexpr uint32_t kSign = 0x80000000u;
  constexpr int64_t kMinNormal = 0x00800000;
  constexpr int64_t kInf = 0x7f800000;
  constexpr int64_t kMaxWord = 0xffffffff;
  // For a normal magnitude m: m + delta underflows iff m < underflow_below, overflows iff
  // m >= overflow_from (clamped into uint32: m < 2^31 never reaches the top).
  const uint32_t underflow_below =
      static_cast<uint32_t>(std::clamp<int64_t>(kMinNormal - delta, 0, kMaxWord));
  const uint32_t overflow_from =
      static_cast<uint32_t>(std::clamp<int64_t>(kInf - delta, 0, kMaxWord));
  const uint32_t add = static_cast<uint32_t>(delta);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = std::bit_cast<uint32_t>(row[i]);
    const uint32_t sign = word & kSign;
    const uint32_t magnitude = word & ~kSign;
    uint32_t out = sign | (magnitude + add);
    out = magnitude >= overflow_from ? (sign | static_cast<uint32_t>(kInf)) : out;
    out = magnitude < underflow_below ? sign : out;
    out = magnitude < kMinNormal ? sign : out;
    out = magnitude >= kInf ? word : out;
    row[i] = std::bit_cast<float>(out);
  }
}

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_FP32_EXPONENT_ADD_H_
