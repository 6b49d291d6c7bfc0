#ifndef MLASERVE_KERNELS_MLA_FLASH_BASE_H_
#define MLASERVE_KERNELS_MLA_FLASH_BASE_H_

#include <limits>

#include "absl/status/statusor.h"
#include "kernels/core/attention_rows.h"
#include "kernels/core/kv_block_source.h"
#include "kernels/core/latent_decode.h"

namespace mlaserve {

// "Base": FlashAttention-2 as the AMLA paper's Algorithm 1 runs it (docs/numerics.md, "Base"). Per
// block of 512 keys: S = Q K^T (bf16 in, fp32 accumulate), online max m, P = exp(S*scale - m) in
// fp32, l updated in fp32 from that P, P cast to bf16 for P V (fp32 accumulate), and the
// fp32 output accumulator rescaled by exp(m_old - m_new) before the new block is added
// (the [V2] stage that reads and writes O). Final O / l in fp32.
void FlashBaseRows(const QueryRows& rows, KvBlockSource& kv, float softmax_scale, RowOutputs out);

// The per-row stages, shared with the emulated device's Base program so both round alike.
struct FlashBaseRowState {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
};

// [V1]: `row` holds scaled, masked scores on entry and bf16(P) on exit. Returns the factor
// exp(m_old - m_new) the output accumulator must be rescaled by.
float FlashBaseSoftmaxStep(float* row, int count, FlashBaseRowState& state);

// [V2]: acc = acc * rescale + pv, or acc = pv on the row's first block (nothing to rescale).
void FlashBaseRescaleAdd(float* acc, const float* pv, int dv, float rescale, bool first_block);

// Final [V]: out = acc / l and lse = m + ln l (zeros and -inf for a row without keys).
void FlashBaseFinalizeRow(const float* acc, int dv, const FlashBaseRowState& state, float* out,
                          float* lse);

// Base over a paged latent decode batch.
absl::StatusOr<AttentionOutput> FlashBaseDecode(const LatentDecodeProblem& problem);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_FLASH_BASE_H_
