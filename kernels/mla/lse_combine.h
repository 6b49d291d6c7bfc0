#ifndef MLASERVE_KERNELS_MLA_LSE_COMBINE_H_
#define MLASERVE_KERNELS_MLA_LSE_COMBINE_H_

#include <cstdint>

namespace mlaserve {

// Merges two partial attention results over disjoint key sets (docs/numerics.md, "LSE combine"),
// all natural log:
//   m = max(lse_a, lse_b),  w = exp(lse - m),
//   out = (w_a out_a + w_b out_b) / (w_a + w_b),   lse = m + ln(w_a + w_b).
// A part with lse = -inf (no keys) has weight 0; two empty parts give out = 0, lse = -inf.
// `out` may alias out_a or out_b.
void CombineLse(const float* out_a, float lse_a, const float* out_b, float lse_b, int dv,
                float* out, float* lse);

// The same for `parts` partial results (a split-KV pass, FlashMLA's combine): with
// m = max_i lse_i and w_i = exp(lse_i - m),
//   out = sum_i (w_i / W) out_i,   lse = m + ln W,   W = sum_i w_i,
// both sums taken in part order, a part of weight 0 contributing exactly 0. For two parts
// this is CombineLse. `outs[i]` points at part i's row; `out` may alias any of them.
void CombineLseParts(int parts, const float* const* outs, const float* lses, int dv, float* out,
                     float* lse);

// Row-wise: `rows` rows of width dv with leading dimension ld in every buffer.
void CombineLseRows(int rows, int dv, const float* out_a, const float* lse_a, const float* out_b,
                    const float* lse_b, int64_t ld, float* out, float* lse);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_LSE_COMBINE_H_
