#include "kernels/reference/flash_base.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/core/block_scores.h"
#include "kernels/core/matmul.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"

namespace mlaserve {

void FlashBaseRows(const QueryRows& rows, KvBlockSource& kv, float softmax_scale, RowOutputs out) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int g = rows.count;
  const int dv = kv.value_width();
  const int max_visible =
      rows.visible.empty() ? 0 : std::min(kv.length(), *std::max_element(rows.visible.begin(), rows.visible.end()));

  std::vector<float> o(static_cast<size_t>(g) * dv, 0.0f);
  std::vector<float> m(g, kNegInf), l(g, 0.0f), rescale(g, 1.0f);
  std::vector<float> s(static_cast<size_t>(g) * kKvBlockTokens);
  std::vector<float> pv(static_cast<size_t>(g) * dv);

  for (int begin = 0; begin < max_visible; begin += kKvBlockTokens) {
    const int count = std::min(kKvBlockTokens, max_visible - begin);
    const KvBlock block = kv.Load(begin, count);
    ComputeBlockScores(rows, block, begin, count, softmax_scale, s.data(), kKvBlockTokens);
    for (int i = 0; i < g; ++i) {
      float* row = s.data() + static_cast<int64_t>(i) * kKvBlockTokens;
      const float m_new = std::max(m[i], RowMax(row, count));
      rescale[i] = m_new == kNegInf ? 1.0f : std::exp(m[i] - m_new);
      ExpShifted(row, count, m_new, row);
      l[i] = l[i] * rescale[i] + RowSum(row, count);
      RoundToBf16InPlace(row, count);
      m[i] = m_new;
    }
    MatmulNN(g, dv, count, s.data(), kKvBlockTokens, block.v, block.ldv, pv.data(), dv,
             /*accumulate=*/false, kPvDepthChunk);
    for (int i = 0; i < g; ++i) {
      float* acc = o.data() + static_cast<int64_t>(i) * dv;
      const float* add = pv.data() + static_cast<int64_t>(i) * dv;
      for (int d = 0; d < dv; ++d) acc[d] = acc[d] * rescale[i] + add[d];
    }
  }

  for (int i = 0; i < g; ++i) {
    float* dst = out.out + i * out.ldo;
    if (l[i] > 0.0f) {
      const float* acc = o.data() + static_cast<int64_t>(i) * dv;
      for (int d = 0; d < dv; ++d) dst[d] = acc[d] / l[i];
      out.lse[i] = m[i] + std::log(l[i]);
    } else {
      std::fill_n(dst, dv, 0.0f);
      out.lse[i] = kNegInf;
    }
  }
}

absl::StatusOr<AttentionOutput> FlashBaseDecode(const LatentDecodeProblem& problem) {
  return RunLatentDecode(problem, FlashBaseRows);
}

}  // namespace mlaserve
