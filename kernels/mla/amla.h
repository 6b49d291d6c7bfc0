#ifndef MLASERVE_KERNELS_MLA_AMLA_H_
#define MLASERVE_KERNELS_MLA_AMLA_H_

#include <cstdint>
#include <limits>
#include <optional>

#include "absl/status/statusor.h"
#include "kernels/core/attention_rows.h"
#include "kernels/core/kv_block_source.h"
#include "kernels/core/latent_decode.h"

namespace mlaserve {

// AMLA (AMLA paper Algorithm 2 + Appendix A; docs/numerics.md, "AMLA"). The fp32 output accumulator
// is kept as  Obar_i = O_i * S16_i  where O_i is FlashAttention's unnormalised accumulator and
// S16_i = bf16(exp(m_i + n_i ln2)) with n_i = round(-m_i / ln 2). Between blocks it is
// rescaled in place by an int32 add on its bits,
//     delta = max(n_i - n_{i-1}, -30) * 2^23 + round(1.5 * 2^23 * eps_i),
// then P_i' V_i is added with P_i' = bf16(P_i * S16_i). docs/numerics.md derives
// eps_i = c_{i-1} / c_i - 1 with c_i = S32_i / S16_i.

// Which mantissa correction the rescale carries (kept selectable so the accuracy sweep can
// show why the derived orientation is the right one).
enum class AmlaCompensation {
  kDerived,            // eps = c_{i-1}/c_i - 1 (Appendix A's recurrence)
  kAlgorithm2Listing,  // eps = c_i/c_{i-1} - 1 (as printed in Algorithm 2, line 11)
  kNone,               // eps = 0
};

struct AmlaOptions {
  AmlaCompensation compensation = AmlaCompensation::kDerived;
};

// What the vector cores remember about one query row between KV blocks.
struct AmlaRowState {
  float m = -std::numeric_limits<float>::infinity();  // running max of scaled scores
  float l = 0.0f;                                     // running softmax denominator, relative to m
  int32_t n = 0;                                      // round(-m / ln 2)
  float s16 = 1.0f;                                   // bf16(S32) for the current m
  float c = 1.0f;                                     // S32 / S16 for the current m
  bool started = false;
};

// The smallest shift the rescale applies (the paper's clamp): older blocks are then worth at
// most 2^-30 of their true weight less, far below bf16 resolution.
inline constexpr int32_t kAmlaMinExponentShift = -30;

// How the accumulator must be rescaled before a block's P V is added: by 2^exponent_shift
// (already clamped at kAmlaMinExponentShift) and AMLA's mantissa correction, both added to
// its bits. Meaningless on a row's first block, which writes instead.
struct AmlaRescale {
  bool first_block = true;
  int32_t exponent_shift = 0;
  int32_t mantissa_fix = 0;
};

// The part of [V1] every AMLA variant shares: scaled, masked scores in `row` become
// p = exp(s - m_new) in place, and m, l, n, S16 and c move to the block. nullopt when the row
// sees no key yet (row zeroed, state unchanged).
std::optional<AmlaRescale> AmlaAdvanceRow(float* row, int count, const AmlaOptions& options,
                                          AmlaRowState& state);

// Stage [V1] for one row of one block. `row` holds scaled, masked scores on entry and
// bf16(P * S16) on exit. Returns the int32 delta to add to the row's accumulator bits before
// this block's P V is added; meaningless (0) on the row's first block, which writes instead.
int32_t AmlaSoftmaxStep(float* row, int count, const AmlaOptions& options, AmlaRowState& state);

// Final [V] stage: out = acc / (l * S16) and lse = m + ln l (zeros and -inf for an empty row).
void AmlaFinalizeRow(const float* acc, int dv, const AmlaRowState& state, float* out, float* lse);

void AmlaRows(const QueryRows& rows, KvBlockSource& kv, float softmax_scale,
              const AmlaOptions& options, RowOutputs out);

absl::StatusOr<AttentionOutput> AmlaDecode(const LatentDecodeProblem& problem,
                                           const AmlaOptions& options = {});

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_AMLA_H_
