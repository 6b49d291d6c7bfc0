#include "kernels/mla/amla.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/block_scores.h"
#include "kernels/core/fp32_exponent_add.h"
#include "kernels/core/matmul.h"
#include "kernels/core/thread_scratch.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"

namespace mlaserve {
namespace {

constexpr float kLn2 = std::numbers::ln2_v<float>;
constexpr float kMantissaScale = 8388608.0f;  // 2^23

// round(-m / ln 2), kept in int32 range even for absurd inputs (float->int overflow is UB).
int32_t ExponentOfMax(float m) {
  const float n = std::nearbyint(-m / kLn2);
  return static_cast<int32_t>(std::clamp(n, -1073741824.0f, 1073741824.0f));
}

}  // namespace

std::optional<AmlaRescale> AmlaAdvanceRow(float* row, int count, const AmlaOptions& options,
                                          AmlaRowState& st) {
  const float m_new = std::max(st.m, RowMax(row, count));
  if (m_new == kNegInf) {  // nothing visible yet: P = 0, state unchanged
    std::fill_n(row, count, 0.0f);
    return std::nullopt;
  }
  const float m_up = std::exp(st.m - m_new);  // exp(-inf) = 0 on the first block
  ExpShifted(row, count, m_new, row);
  st.l = st.l * m_up + RowSum(row, count);

  const int32_t n_new = ExponentOfMax(m_new);
  const float s32 = std::exp(std::fma(static_cast<float>(n_new), kLn2, m_new));  // in [2^-.5, 2^.5]
  const float s16 = RoundToBf16(s32);
  const float c_new = s32 / s16;

  AmlaRescale rescale;
  rescale.first_block = !st.started;
  if (st.started) {
    float ratio = 1.0f;
    switch (options.compensation) {
      case AmlaCompensation::kDerived:
        ratio = st.c / c_new;
        break;
      case AmlaCompensation::kAlgorithm2Listing:
        ratio = c_new / st.c;
        break;
      case AmlaCompensation::kNone:
        break;
    }
    rescale.exponent_shift = std::max(n_new - st.n, kAmlaMinExponentShift);
    rescale.mantissa_fix =
        static_cast<int32_t>(std::nearbyint(1.5f * (ratio - 1.0f) * kMantissaScale));
  }
  st.m = m_new;
  st.n = n_new;
  st.s16 = s16;
  st.c = c_new;
  st.started = true;
  return rescale;
}

int32_t AmlaSoftmaxStep(float* row, int count, const AmlaOptions& options, AmlaRowState& st) {
  const std::optional<AmlaRescale> rescale = AmlaAdvanceRow(row, count, options, st);
  if (!rescale.has_value()) return 0;
  ScaleToBf16(row, count, st.s16, row);
  if (rescale->first_block) return 0;
  return rescale->exponent_shift * (int32_t{1} << 23) + rescale->mantissa_fix;
}

void AmlaFinalizeRow(const float* acc, int dv, const AmlaRowState& st, float* out, float* lse) {
  if (!st.started || !(st.l > 0.0f)) {
    std::fill_n(out, dv, 0.0f);
    *lse = kNegInf;
    return;
  }
  const float denominator = st.l * st.s16;
  for (int d = 0; d < dv; ++d) out[d] = acc[d] / denominator;
  *lse = st.m + std::log(st.l);
}

void AmlaRows(const QueryRows& rows, KvBlockSource& kv, float softmax_scale,
              const AmlaOptions& options, RowOutputs out) {
  const int g = rows.count;
  const int dk = rows.dk;
  const int dv = kv.value_width();
  const int max_visible =
      rows.visible.empty()
          ? 0
          : std::min(kv.length(), *std::max_element(rows.visible.begin(), rows.visible.end()));

  // The matrix unit's operands are bf16: q once, P per block; K and V are read in place
  // from the cache (no widening), which gives the same tile calls as the emulated cube.
  std::vector<Bf16> q(static_cast<size_t>(g) * dk);
  for (int i = 0; i < g; ++i)
    NarrowToBf16(rows.q + i * rows.ldq, dk, q.data() + static_cast<int64_t>(i) * dk);
  // The accumulator lives in "global memory": only integer adds and fp32 adds touch it.
  std::vector<float> acc(static_cast<size_t>(g) * dv, 0.0f);
  std::vector<AmlaRowState> state(g);
  std::vector<int32_t> delta(g);
  ThreadScratch<struct Scores, float> p(static_cast<size_t>(g) * kKvBlockTokens);
  ThreadScratch<struct Probabilities, Bf16> p16(static_cast<size_t>(g) * kKvBlockTokens);
  ThreadScratch<struct BlockPv, float> pv(static_cast<size_t>(g) * dv);
  std::vector<const Bf16*> k_rows(kKvBlockTokens), v_rows(kKvBlockTokens);

  for (int begin = 0; begin < max_visible; begin += kKvBlockTokens) {
    const int count = std::min(kKvBlockTokens, max_visible - begin);
    kv.Rows(begin, count, k_rows.data(), v_rows.data());
    MatmulBf16Rows(/*b_transposed=*/true, g, count, dk, q.data(), dk, k_rows.data(), p.data(),
                   kKvBlockTokens,
                   /*accumulate=*/false, kQkDepthChunk);
    ScaleAndMaskScores(rows, begin, count, softmax_scale, p.data(), kKvBlockTokens);
    for (int i = 0; i < g; ++i) {
      float* row = p.data() + static_cast<int64_t>(i) * kKvBlockTokens;
      delta[i] = AmlaSoftmaxStep(row, count, options, state[i]);
      NarrowToBf16(row, count,
                   p16.data() + static_cast<int64_t>(i) * count);  // exact: already bf16
    }
    MatmulBf16Rows(/*b_transposed=*/false, g, dv, count, p16.data(), count, v_rows.data(),
                   pv.data(), dv,
                   /*accumulate=*/false, kPvDepthChunk);
    const bool first_block = begin == 0;
    for (int i = 0; i < g; ++i) {
      float* dst = acc.data() + static_cast<int64_t>(i) * dv;
      const float* add = pv.data() + static_cast<int64_t>(i) * dv;
      if (first_block) {  // [C2] writes the first block instead of adding it
        std::copy_n(add, dv, dst);
        continue;
      }
      AddToExponentFieldRow(dst, dv, delta[i]);       // int32 atomic add
      for (int d = 0; d < dv; ++d) dst[d] += add[d];  // fp32 atomic add
    }
  }

  for (int i = 0; i < g; ++i) {
    AmlaFinalizeRow(acc.data() + static_cast<int64_t>(i) * dv, dv, state[i], out.out + i * out.ldo,
                    out.lse + i);
  }
}

absl::StatusOr<AttentionOutput> AmlaDecode(const LatentDecodeProblem& problem,
                                           const AmlaOptions& options) {
  return RunLatentDecode(problem, [&](const QueryRows& rows, KvBlockSource& kv, float scale,
                                      RowOutputs out) { AmlaRows(rows, kv, scale, options, out); });
}

}  // namespace mlaserve
