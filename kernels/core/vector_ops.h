#ifndef MLASERVE_KERNELS_CORE_VECTOR_OPS_H_
#define MLASERVE_KERNELS_CORE_VECTOR_OPS_H_

#include <cstdint>
#include <limits>

#include "kernels/core/bfloat16.h"

namespace mlaserve {

// The score of a key a row must not see, and the largest of no scores.
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row operations of the vector unit. Each has one fixed evaluation order, shared by the
// host kernels and the emulated AIV programs, so both produce identical bits.

// Largest element of x[0..n); -inf for n == 0.
float RowMax(const float* x, int n);

// Sum of x[0..n) in the vector unit's order: 64 fp32 lanes (one 256-byte repeat) accumulate
// repeat by repeat, then the lanes reduce pairwise.
float RowSum(const float* x, int n);

// y[j] = exp(x[j] - shift); a shift of -inf (no visible key yet) yields zeros.
void ExpShifted(const float* x, int n, float shift, float* y);

// y[j] = bf16(x[j] * factor): the cast that feeds the matrix unit.
void ScaleToBf16(const float* x, int n, float factor, float* y);

// x[j] = bf16(x[j]).
void RoundToBf16InPlace(float* x, int64_t n);

// Widens n bf16 values to fp32.
void WidenBf16(const Bf16* in, int64_t n, float* out);

// out[j] = Bf16::FromFloat(in[j]) (round to nearest even, NaN kept quiet), written so the
// compiler vectorises it; exact for values that are bf16 already.
void NarrowToBf16(const float* in, int64_t n, Bf16* out);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_VECTOR_OPS_H_
