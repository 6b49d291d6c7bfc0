#ifndef MLASERVE_KERNELS_MLA_LSE_COMBINE_H_
#define MLASERVE_KERNELS_MLA_LSE_COMBINE_H_

#include <cstdint>

namespace mlaserve {

// Merges two partial attention results over disjoint key sets (design §2.3), all natural log:
//   m = max(lse_a, lse_b),  w = exp(lse - m),
//   out = (w_a out_a + w_b out_b) / (w_a + w_b),   lse = m + ln(w_a + w_b).
// A part with lse = -inf (no keys) has weight 0; two empty parts give out = 0, lse = -inf.
// `out` may alias out_a or out_b.
void CombineLse(const float* out_a, float lse_a, const float* out_b, float lse_b, int dv,
                float* out, float* lse);

// Row-wise: `rows` rows of width dv with leading dimension ld in every buffer.
void CombineLseRows(int rows, int dv, const float* out_a, const float* lse_a, const float* out_b,
                    const float* lse_b, int64_t ld, float* out, float* lse);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_LSE_COMBINE_H_
