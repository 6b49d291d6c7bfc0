#ifndef MLASERVE_KERNELS_MLA_ATTENTION_KERNEL_H_
#define MLASERVE_KERNELS_MLA_ATTENTION_KERNEL_H_

#include <string_view>

#include "kernels/core/attention_rows.h"
#include "kernels/core/kv_block_source.h"

namespace mlaserve {

// The row kernels a formulation (absorb, naive, TyphoonMLA) can run on.
enum class AttentionKernel { kAmla, kBase };

constexpr std::string_view AttentionKernelName(AttentionKernel k) {
  return k == AttentionKernel::kAmla ? "amla" : "base";
}

void RunAttentionRows(AttentionKernel kernel, const QueryRows& rows, KvBlockSource& kv,
                      float softmax_scale, RowOutputs out);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_ATTENTION_KERNEL_H_
