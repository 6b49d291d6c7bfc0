#include "kernels/mla/flash_base.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/core/block_scores.h"
#include "kernels/core/matmul.h"
#include "kernels/core/thread_scratch.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"

namespace mlaserve {

float FlashBaseSoftmaxStep(float* row, int count, FlashBaseRowState& st) {
  const float m_new = std::max(st.m, RowMax(row, count));
  const float rescale = m_new == kNegInf ? 1.0f : std::exp(st.m - m_new);
  ExpShifted(row, count, m_new, row);
  st.l = st.l * rescale + RowSum(row, count);
  RoundToBf16InPlace(row, count);
  st.m = m_new;
  return rescale;
}

void FlashBaseRescaleAdd(float* acc, const float* pv, int dv, float rescale, bool first_block) {
  if (first_block) {
    std::copy_n(pv, dv, acc);
    return;
  }
  for (int d = 0; d < dv; ++d) acc[d] = acc[d] * rescale + pv[d];
}

void FlashBaseFinalizeRow(const float* acc, int dv, const FlashBaseRowState& st, float* out,
                          float* lse) {
  if (!(st.l > 0.0f)) {
    std::fill_n(out, dv, 0.0f);
    *lse = kNegInf;
    return;
  }
  for (int d = 0; d < dv; ++d) out[d] = acc[d] / st.l;
  *lse = st.m + std::log(st.l);
}

void FlashBaseRows(const QueryRows& rows, KvBlockSource& kv, float softmax_scale, RowOutputs out) {
  const int g = rows.count;
  const int dv = kv.value_width();
  const int max_visible =
      rows.visible.empty()
          ? 0
          : std::min(kv.length(), *std::max_element(rows.visible.begin(), rows.visible.end()));

  std::vector<float> acc(static_cast<size_t>(g) * dv, 0.0f);
  std::vector<FlashBaseRowState> state(g);
  std::vector<float> rescale(g, 1.0f);
  ThreadScratch<struct Scores, float> s(static_cast<size_t>(g) * kKvBlockTokens);
  ThreadScratch<struct BlockPv, float> pv(static_cast<size_t>(g) * dv);

  for (int begin = 0; begin < max_visible; begin += kKvBlockTokens) {
    const int count = std::min(kKvBlockTokens, max_visible - begin);
    const KvBlock block = kv.Load(begin, count);
    ComputeBlockScores(rows, block, begin, count, softmax_scale, s.data(), kKvBlockTokens);
    for (int i = 0; i < g; ++i) {
      rescale[i] = FlashBaseSoftmaxStep(s.data() + static_cast<int64_t>(i) * kKvBlockTokens, count,
                                        state[i]);
    }
    MatmulNN(g, dv, count, s.data(), kKvBlockTokens, block.v, block.ldv, pv.data(), dv,
             /*accumulate=*/false, kPvDepthChunk);
    for (int i = 0; i < g; ++i) {
      FlashBaseRescaleAdd(acc.data() + static_cast<int64_t>(i) * dv,
                          pv.data() + static_cast<int64_t>(i) * dv, dv, rescale[i], begin == 0);
    }
  }
  for (int i = 0; i < g; ++i) {
    FlashBaseFinalizeRow(acc.data() + static_cast<int64_t>(i) * dv, dv, state[i],
                         out.out + i * out.ldo, out.lse + i);
  }
}

absl::StatusOr<AttentionOutput> FlashBaseDecode(const LatentDecodeProblem& problem) {
  return RunLatentDecode(problem, FlashBaseRows);
}

}  // namespace mlaserve
