#include "kernels/mla/snap_amla.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "common/status_macros.h"
#include "kernels/core/fp32_exponent_add.h"
#include "kernels/core/fp8_latent_row.h"
#include "kernels/core/matmul.h"
#include "kernels/core/thread_scratch.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"

namespace mlaserve {
namespace {

// Below this the whole accumulator underflows anyway; above it the delta leaves int32.
constexpr int32_t kMinTotalShift = -255;

// 2^e as a float; e stays within [-112, 112] here (docs/numerics.md derives the bounds).
float PowerOfTwo(int32_t e) { return std::ldexp(1.0f, e); }

constexpr float kFp8MinNormal = 0.015625f;  // 2^-6, e4m3's smallest normal value

}  // namespace

void ScaleAndMaskFp8Scores(std::span<const int32_t> visible, int begin, int count,
                           const float* row_factor, const float* key_scales, float* s,
                           int64_t lds) {
  for (size_t i = 0; i < visible.size(); ++i) {
    float* row = s + static_cast<int64_t>(i) * lds;
    const int seen = std::clamp(visible[i] - begin, 0, count);
    for (int j = 0; j < seen; ++j) row[j] = (row[j] * row_factor[i]) * key_scales[j];
    std::fill(row + seen, row + count, kNegInf);
  }
}

int32_t Fp8ScaleExponent(float amax) {
  int e = 0;
  const float fraction = std::frexp(amax, &e);  // amax = fraction * 2^e, fraction in [0.5, 1)
  // 448 = 0.875 * 2^9, so amax <= 448 * 2^k  <=>  fraction * 2^(e - 9 - k) <= 0.875.
  return fraction <= 0.875f ? e - 9 : e - 8;
}

Fp8KeyBlock MakeFp8KeyBlock(const float* scales, int count, float* inverse_scales) {
  float max_scale = 0.0f;
  for (int j = 0; j < count; ++j) {
    inverse_scales[j] = 1.0f / scales[j];
    max_scale = std::max(max_scale, scales[j]);
  }
  return {scales, inverse_scales, max_scale};
}

int32_t SnapAmlaSoftmaxStep(float* row, const Fp8KeyBlock& keys, int count, float* weights,
                            SnapAmlaRowState& state) {
  const bool was_started = state.amla.started;
  const std::optional<AmlaRescale> rescale = AmlaAdvanceRow(row, count, {}, state.amla);
  if (!rescale.has_value()) return 0;

  // p <= 1, so x_j = (p_j S16) sk_j <= S16 max_k sk_k: P's exponent comes from that bound,
  // no per-row maximum needed, and never below the floor that keeps the accumulator from
  // growing (see the header).
  const float s16 = state.amla.s16;
  const float bound = s16 * keys.max_scale;
  const int32_t floor = was_started ? state.p_exponent + rescale->exponent_shift
                                    : std::numeric_limits<int32_t>::min();
  const int32_t exponent =
      bound > 0.0f ? std::max(Fp8ScaleExponent(bound), floor) : (was_started ? floor : 0);
  // S16 * 2^-e is exact, so this is (p S16) sk 2^-e with one multiplication fewer.
  const float factor = s16 * PowerOfTwo(-exponent);
  for (int j = 0; j < count; ++j) {
    const float scaled = (row[j] * factor) * keys.scales[j];
    const float p8 = Fp8E4m3::FromFloat(scaled).ToFloat();
    // The weight P8 gives value row j, P8 / sk_j. Below e4m3's normal range (2^-6) the code
    // keeps under 3 bits of it, or nothing, so there the unrounded value counts instead
    // (p S16 2^-e, to fp32 rounding): a key whose P is lost to rounding (a small scale
    // beside a large one) still holds its share of the softmax's mass, as a zero value row,
    // rather than handing it to the larger rows.
    weights[j] = (p8 >= kFp8MinNormal ? p8 : scaled) * keys.inverse_scales[j];
    row[j] = p8;
  }
  const float block_weight = RowSum(weights, count);

  int32_t delta = 0;
  if (rescale->first_block) {
    state.weight_sum = block_weight;
  } else {
    const int32_t shift =
        std::max(rescale->exponent_shift - (exponent - state.p_exponent), kMinTotalShift);
    delta = shift * (int32_t{1} << 23) + rescale->mantissa_fix;
    state.weight_sum = AddToExponentField(state.weight_sum, delta) + block_weight;
  }
  state.p_exponent = exponent;
  return delta;
}

void SnapAmlaFinalizeRow(const float* acc, int dv, const SnapAmlaRowState& state, float* out,
                         float* lse) {
  const AmlaRowState& st = state.amla;
  if (!st.started || !(st.l > 0.0f)) {
    std::fill_n(out, dv, 0.0f);
    *lse = kNegInf;
    return;
  }
  // Every weight rounded to zero (keys 2^18 below the block's largest scale) leaves no mix
  // to take; the LSE, from the unrounded p, still stands.
  if (state.weight_sum > 0.0f) {
    for (int d = 0; d < dv; ++d) out[d] = acc[d] / state.weight_sum;
  } else {
    std::fill_n(out, dv, 0.0f);
  }
  *lse = st.m + std::log(st.l);
}

void PrepareQueryRows(const QueryRows& rows, int dl, float softmax_scale,
                      const SnapAmlaOptions& options, Bf16* q_prepared, float* row_factor) {
  const int dr = rows.dk - dl;
  std::vector<Fp8E4m3> content(dl);
  for (int i = 0; i < rows.count; ++i) {
    Bf16* q = q_prepared + static_cast<int64_t>(i) * rows.dk;
    if (!options.quantize_queries) {
      NarrowToBf16(rows.q + i * rows.ldq, rows.dk, q);  // exact: the rows are bf16 values
      row_factor[i] = softmax_scale;
      continue;
    }
    float scale = 0.0f;
    QuantizeLatentRow(rows.q + i * rows.ldq, dl, dr, Fp8LatentRow{content.data(), &scale, q + dl});
    WidenFp8ToBf16(content.data(), dl, q);
    row_factor[i] = scale * softmax_scale;
  }
}

void SnapAmlaRows(const QueryRows& rows, const Fp8SequenceKeys& keys, float softmax_scale,
                  const SnapAmlaOptions& options, RowOutputs out) {
  const int g = rows.count;
  const int dk = rows.dk;
  const int dl = keys.cache.layout.dl;
  const int max_visible =
      rows.visible.empty()
          ? 0
          : std::min(keys.length, *std::max_element(rows.visible.begin(), rows.visible.end()));

  std::vector<Bf16> q(static_cast<size_t>(g) * dk);
  std::vector<float> row_factor(g);
  PrepareQueryRows(rows, dl, softmax_scale, options, q.data(), row_factor.data());

  // Keys widened block by block (what the vector unit does for a cube without an fp8 rate);
  // the values are the same rows' first dl columns.
  ThreadScratch<struct BlockKeys, Bf16> block_keys(static_cast<size_t>(kKvBlockTokens) * dk);
  std::vector<float> key_scales(kKvBlockTokens);
  std::vector<float> inverse_scales(kKvBlockTokens);
  std::vector<const Bf16*> key_rows(kKvBlockTokens);
  for (int t = 0; t < kKvBlockTokens; ++t) key_rows[t] = block_keys.data() + t * dk;

  std::vector<float> acc(static_cast<size_t>(g) * dl, 0.0f);
  std::vector<SnapAmlaRowState> state(g);
  std::vector<int32_t> delta(g);
  ThreadScratch<struct Scores, float> s(static_cast<size_t>(g) * kKvBlockTokens);
  std::vector<float> weights(kKvBlockTokens);
  ThreadScratch<struct Probabilities, Bf16> p8(static_cast<size_t>(g) * kKvBlockTokens);
  ThreadScratch<struct BlockPv, float> pv(static_cast<size_t>(g) * dl);

  for (int begin = 0; begin < max_visible; begin += kKvBlockTokens) {
    const int count = std::min(kKvBlockTokens, max_visible - begin);
    keys.Widen(begin, count, block_keys.data(), dk, key_scales.data());
    MatmulBf16Rows(/*b_transposed=*/true, g, count, dk, q.data(), dk, key_rows.data(), s.data(),
                   kKvBlockTokens, /*accumulate=*/false, kQkDepthChunk);
    ScaleAndMaskFp8Scores(rows.visible, begin, count, row_factor.data(), key_scales.data(),
                          s.data(), kKvBlockTokens);
    const Fp8KeyBlock key_block = MakeFp8KeyBlock(key_scales.data(), count, inverse_scales.data());
    for (int i = 0; i < g; ++i) {
      float* row = s.data() + static_cast<int64_t>(i) * kKvBlockTokens;
      delta[i] = SnapAmlaSoftmaxStep(row, key_block, count, weights.data(), state[i]);
      NarrowToBf16(row, count, p8.data() + static_cast<int64_t>(i) * count);  // exact: fp8 values
    }
    MatmulBf16Rows(/*b_transposed=*/false, g, dl, count, p8.data(), count, key_rows.data(),
                   pv.data(), dl, /*accumulate=*/false, kPvDepthChunk);
    const bool first_block = begin == 0;
    for (int i = 0; i < g; ++i) {
      float* dst = acc.data() + static_cast<int64_t>(i) * dl;
      const float* add = pv.data() + static_cast<int64_t>(i) * dl;
      if (first_block) {
        std::copy_n(add, dl, dst);
        continue;
      }
      AddToExponentFieldRow(dst, dl, delta[i]);
      for (int d = 0; d < dl; ++d) dst[d] += add[d];
    }
  }

  for (int i = 0; i < g; ++i) {
    SnapAmlaFinalizeRow(acc.data() + static_cast<int64_t>(i) * dl, dl, state[i],
                        out.out + i * out.ldo, out.lse + i);
  }
}

absl::StatusOr<AttentionOutput> SnapAmlaDecode(const Fp8LatentDecodeProblem& p,
                                               const SnapAmlaOptions& options) {
  if (p.q.stride(3) != 1) {
    return absl::InvalidArgumentError("q rows must be contiguous in their last axis");
  }
  const Fp8PageLayout& layout = p.cache.layout;
  if (p.dk() != layout.dl + layout.dr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q head dim ", p.dk(), " differs from the cache's dl + dr = ", layout.dl + layout.dr));
  }
  RETURN_IF_ERROR(ValidateFp8PagedDecode(p.softmax_scale, p.batch(), p.cache, p.seqs));
  const int dv = layout.dl;
  const int rows_per_request = p.sq() * p.heads();
  AttentionOutput result;
  result.out.resize(static_cast<size_t>(p.batch()) * rows_per_request * dv);
  result.lse.resize(static_cast<size_t>(p.batch()) * rows_per_request);

  std::vector<float> q(static_cast<size_t>(rows_per_request) * p.dk());
  std::vector<int32_t> visible(rows_per_request);
  for (int b = 0; b < p.batch(); ++b) {
    const int32_t length = p.seqs.seqlens[b];
    for (int s = 0; s < p.sq(); ++s) {
      const int keys = VisibleKeys(length, p.sq(), s, p.causal);
      for (int h = 0; h < p.heads(); ++h) {
        const int row = s * p.heads() + h;
        visible[row] = keys;
        WidenBf16(p.q.row(b, s, h), p.dk(), q.data() + static_cast<int64_t>(row) * p.dk());
      }
    }
    const Fp8SequenceKeys keys{
        p.cache,
        {p.seqs.block_table.row(b), static_cast<size_t>(p.seqs.block_table.dim(1))},
        /*first_token=*/0,
        length};
    const int64_t first_row = static_cast<int64_t>(b) * rows_per_request;
    SnapAmlaRows(QueryRows{q.data(), p.dk(), rows_per_request, p.dk(), visible}, keys,
                 p.softmax_scale, options,
                 RowOutputs{result.out.data() + first_row * dv, dv, result.lse.data() + first_row});
  }
  return result;
}

}  // namespace mlaserve
