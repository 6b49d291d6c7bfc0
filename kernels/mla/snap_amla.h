#ifndef MLASERVE_KERNELS_MLA_SNAP_AMLA_H_
#define MLASERVE_KERNELS_MLA_SNAP_AMLA_H_

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "kernels/core/attention_rows.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/latent_decode.h"
#include "kernels/core/tensor_view.h"
#include "kernels/mla/amla.h"

namespace mlaserve {

// AMLA over the FP8 latent cache, after SnapMLA's Algorithm 1 (docs/numerics.md, "SnapMLA
// over AMLA"). Per query row i (one token, one head) and per block of kKvBlockTokens keys:
//
//   [prep] q_i in the cache's form (QuantizeLatentRow): content e4m3, rope bf16, scale sq_i;
//          row factor  f_i = sq_i * softmax_scale
//   [C1]   raw_ij = q8_i . k8_j + qr_i . kr_j   one bf16 matmul over the widened operands
//          (every e4m3 value is a bf16 value and each product is exact in fp32, so this is
//          the FP8 matrix unit's answer with fp32 accumulation, in the same order)
//   [V1]   s_ij = (raw_ij * f_i) * sk_j          both scales at once: the RoPE part was
//          stored divided by sk_j and the query's by sq_i (Eq. 6), masked keys -inf
//          p_ij = exp(s_ij - m_i), l_i, n_i, S16_i exactly as AMLA (kernels/mla/amla.h)
//          P8_ij = e4m3((p_ij * (S16_i * 2^-e_i)) * sk_j)   the V scale folded into P
//                  (V = sk_j * k8_j), P quantised per row and block
//          w_i   = w_i (rescaled like acc_i) + sum_j w_ij,   the weights P8 gives:
//                  w_ij = P8_ij * (1 / sk_j) where P8_ij >= 2^-6 (e4m3's normal range),
//                  else the unrounded ((p_ij S16_i) sk_j 2^-e_i) * (1 / sk_j)
//   [C2]   acc_i = acc_i (rescaled by an int32 add on its bits) + P8_i . V8   (fp32)
//   [V]    out_i = acc_i / w_i,  lse_i = m_i + ln l_i
//
// Normalising by the quantised weights' own sum (w) rather than by l makes every output a
// convex combination of value rows: P's rounding then only perturbs the mix, never the
// output's scale (a near one-hot row comes back as its value row, not 1 +- 2^-4 times it).
// l, from the unrounded p, still gives the LSE. On the unit-variance data sets this halves
// the kernel's error on peaked rows (docs/numerics.md, "FP8 accuracy"). Keys whose P8 falls
// below e4m3's normal range keep their unrounded weight: when key scales span many binades
// (a few tokens of large scale beside many small ones), the small keys' P8 round to zero,
// and counting only P8 would hand their share of the softmax to the large rows (an output
// hundreds of times too large was seen on heavy-tailed keys); this way they count as zero
// value rows, an error no larger than their P8's.
//
// The P scale is a power of two, 2^e_i, so that it joins AMLA's integer-add rescale: the
// accumulator holds O * S16 * 2^-e, and between blocks its bits get
//     delta = (max(n_i - n_{i-1}, -30) - (e_i - e_{i-1})) * 2^23 + AMLA's mantissa fix.
// e_i is the smallest exponent with S16_i * max_j sk_j <= 448 * 2^e_i, a bound of every
// (p S16) sk_j since p <= 1 (P never saturates, and no per-row maximum is needed: e4m3 is
// a floating-point format, so a power-of-two scale changes P8 only where values leave its
// normal range, which the weights above allow for), but never
// below e_{i-1} + max(n_i - n_{i-1}, -30), so the shift is never positive and the accumulator
// never grows past what the running max allows (a block far below the running max loses the
// fp8 codes below 2^-9 of that max, as it would against a per-tensor P scale). A shift under
// -255 leaves nothing in fp32, so it is clamped there to keep the delta in int32.

// What the vector cores remember about one row between blocks: AMLA's state and e_i.
struct SnapAmlaRowState {
  AmlaRowState amla;
  int32_t p_exponent = 0;
  float weight_sum = 0.0f;  // w_i, in the accumulator's units
};

// A block's key scales as [V1] reads them, worked out once for all its rows.
struct Fp8KeyBlock {
  const float* scales = nullptr;          // sk_j
  const float* inverse_scales = nullptr;  // 1 / sk_j (fp32 division)
  float max_scale = 0.0f;                 // max_j sk_j
};
Fp8KeyBlock MakeFp8KeyBlock(const float* scales, int count, float* inverse_scales);

// [V1] for one row of one block: `row` holds scaled, masked scores on entry and the fp8 P
// values (as floats) on exit; `weights` is scratch for `count` floats. Returns the int32
// delta for the accumulator (0 on the row's first block, which writes instead); w is
// rescaled and advanced here.
int32_t SnapAmlaSoftmaxStep(float* row, const Fp8KeyBlock& keys, int count, float* weights,
                            SnapAmlaRowState& state);

// [V]: out = acc / w and lse = m + ln l; zeros and -inf for an empty row.
void SnapAmlaFinalizeRow(const float* acc, int dv, const SnapAmlaRowState& state, float* out,
                         float* lse);

// [V1]'s first half for FP8 keys, on the raw products [C1] left in `s` (row i of `rows`
// rows, lds apart, keys [begin, begin + count) of the row group): s = (raw * f_i) * sk_j for
// the keys row i sees, -inf for the others. `key_scales` are the block's sk_j.
void ScaleAndMaskFp8Scores(std::span<const int32_t> visible, int begin, int count,
                           const float* row_factor, const float* key_scales, float* s, int64_t lds);

// The smallest e with amax <= 448 * 2^e, for amax > 0.
int32_t Fp8ScaleExponent(float amax);

struct SnapAmlaOptions {
  // SnapMLA quantises the queries so that [C1] runs on an FP8 matrix unit. A matrix unit
  // without an FP8 rate multiplies bf16 anyway, and there the bf16 query (sq_i = 1, f_i =
  // softmax_scale, [prep] skipped) is exact and costs nothing: on keys whose channels carry
  // very different magnitudes the query's rounding is the kernel's largest error
  // (docs/numerics.md, "FP8 accuracy").
  bool quantize_queries = true;
};

// Query rows as [C1] multiplies them ([rows][dl + dr] bf16: the widened fp8 content and the
// scaled rope, or the bf16 query itself) and each row's factor f_i.
void PrepareQueryRows(const QueryRows& rows, int dl, float softmax_scale,
                      const SnapAmlaOptions& options, Bf16* q_prepared, float* row_factor);

// Rows against one sequence's keys in the FP8 cache; values are the keys' first dl columns.
void SnapAmlaRows(const QueryRows& rows, const Fp8SequenceKeys& keys, float softmax_scale,
                  const SnapAmlaOptions& options, RowOutputs out);

// A batch of latent-space decode queries against the FP8 cache: FlashMLA's problem with
// SnapMLA's cache. Row order as in LatentDecodeProblem; outputs are dl wide.
struct Fp8LatentDecodeProblem {
  TensorView<const Bf16, 4> q;  // [batch][sq][heads][dl + dr], unquantised
  Fp8PagedKvCache cache;
  PagedSequences seqs;
  float softmax_scale = 0.0f;
  bool causal = true;

  int batch() const { return static_cast<int>(q.dim(0)); }
  int sq() const { return static_cast<int>(q.dim(1)); }
  int heads() const { return static_cast<int>(q.dim(2)); }
  int dk() const { return static_cast<int>(q.dim(3)); }
};

absl::StatusOr<AttentionOutput> SnapAmlaDecode(const Fp8LatentDecodeProblem& problem,
                                               const SnapAmlaOptions& options = {});

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_SNAP_AMLA_H_
