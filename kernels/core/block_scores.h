#ifndef MLASERVE_KERNELS_CORE_BLOCK_SCORES_H_
#define MLASERVE_KERNELS_CORE_BLOCK_SCORES_H_

#include <cstdint>

#include "kernels/core/attention_rows.h"
#include "kernels/core/kv_block_source.h"

namespace mlaserve {

// Scaled, masked scores of one KV block (stage [C1] plus the scale of [V1]):
//   s[i][j] = (q_i . k_{begin+j}) * scale   if key begin+j is visible to row i,
//             -inf                           otherwise,
// for j < count. The dot products go through the matrix unit's chunked accumulation.
void ComputeBlockScores(const QueryRows& rows, const KvBlock& block, int begin, int count,
                        float scale, float* s, int64_t lds);

// Applies the mask and the scale to raw products already in s (the vector-side half, used
// by the emulated device after its cube has written Q·K^T).
void ScaleAndMaskScores(const QueryRows& rows, int begin, int count, float scale, float* s,
                        int64_t lds);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_BLOCK_SCORES_H_
