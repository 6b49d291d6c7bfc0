#include "kernels/mla/lse_combine.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/core/vector_ops.h"

namespace mlaserve {

void CombineLseParts(int parts, const float* const* outs, const float* lses, int dv, float* out,
                     float* lse) {
  float m = kNegInf;
  for (int i = 0; i < parts; ++i) m = std::max(m, lses[i]);
  if (m == kNegInf) {
    std::fill_n(out, dv, 0.0f);
    *lse = kNegInf;
    return;
  }
  constexpr int kMaxStackParts = 64;
  float stack_weights[kMaxStackParts];
  std::vector<float> heap_weights;
  float* f = stack_weights;
  if (parts > kMaxStackParts) {
    heap_weights.resize(parts);
    f = heap_weights.data();
  }
  float total = 0.0f;
  for (int i = 0; i < parts; ++i) {
    f[i] = std::exp(lses[i] - m);
    total = i == 0 ? f[i] : total + f[i];
  }
  for (int i = 0; i < parts; ++i) f[i] = f[i] / total;
  for (int d = 0; d < dv; ++d) {
    // Skip a zero-weight part entirely so an empty partial's placeholder never leaks in.
    float sum = f[0] == 0.0f ? 0.0f : f[0] * outs[0][d];
    for (int i = 1; i < parts; ++i) sum += f[i] == 0.0f ? 0.0f : f[i] * outs[i][d];
    out[d] = sum;
  }
  *lse = m + std::log(total);
}

void CombineLse(const float* out_a, float lse_a, const float* out_b, float lse_b, int dv,
                float* out, float* lse) {
  const float* outs[2] = {out_a, out_b};
  const float lses[2] = {lse_a, lse_b};
  CombineLseParts(2, outs, lses, dv, out, lse);
}

void CombineLseRows(int rows, int dv, const float* out_a, const float* lse_a, const float* out_b,
                    const float* lse_b, int64_t ld, float* out, float* lse) {
  for (int i = 0; i < rows; ++i) {
    CombineLse(out_a + i * ld, lse_a[i], out_b + i * ld, lse_b[i], dv, out + i * ld, lse + i);
  }
}

}  // namespace mlaserve
