#ifndef MLASERVE_KERNELS_MLA_ROW_ATTENTION_H_
#define MLASERVE_KERNELS_MLA_ROW_ATTENTION_H_

#include "kernels/core/attention_rows.h"
#include "kernels/core/kv_block_source.h"
#include "kernels/mla/rescale_algorithm.h"

namespace mlaserve {

// The host row kernels behind every formulation (absorb, naive, TyphoonMLA): attention of
// `rows` over `kv` with AMLA's or Base's rescaling.
void RunRowAttention(RescaleAlgorithm algorithm, const QueryRows& rows, KvBlockSource& kv,
                     float softmax_scale, RowOutputs out);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_ROW_ATTENTION_H_
