#include "kernels/mla/attention_kernel.h"

#include "kernels/mla/amla.h"
#include "kernels/reference/flash_base.h"

namespace mlaserve {

void RunAttentionRows(AttentionKernel kernel, const QueryRows& rows, KvBlockSource& kv,
                      float softmax_scale, RowOutputs out) {
  switch (kernel) {
    case AttentionKernel::kAmla:
      AmlaRows(rows, kv, softmax_scale, AmlaOptions{}, out);
      return;
    case AttentionKernel::kBase:
      FlashBaseRows(rows, kv, softmax_scale, out);
      return;
  }
}

}  // namespace mlaserve
