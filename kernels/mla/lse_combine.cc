#include "kernels/mla/lse_combine.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mlaserve {

void CombineLse(const float* out_a, float lse_a, const float* out_b, float lse_b, int dv,
                float* out, float* lse) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float m = std::max(lse_a, lse_b);
  if (m == kNegInf) {
    std::fill_n(out, dv, 0.0f);
    *lse = kNegInf;
    return;
  }
  const float w_a = std::exp(lse_a - m);
  const float w_b = std::exp(lse_b - m);
  const float total = w_a + w_b;
  const float f_a = w_a / total;
  const float f_b = w_b / total;
  for (int d = 0; d < dv; ++d) {
    // Skip a zero-weight part entirely so an empty partial's placeholder never leaks in.
    const float a = f_a == 0.0f ? 0.0f : f_a * out_a[d];
    const float b = f_b == 0.0f ? 0.0f : f_b * out_b[d];
    out[d] = a + b;
  }
  *lse = m + std::log(total);
}

void CombineLseRows(int rows, int dv, const float* out_a, const float* lse_a, const float* out_b,
                    const float* lse_b, int64_t ld, float* out, float* lse) {
  for (int i = 0; i < rows; ++i) {
    CombineLse(out_a + i * ld, lse_a[i], out_b + i * ld, lse_b[i], dv, out + i * ld, lse + i);
  }
}

}  // namespace mlaserve
