#include "kernels/mla/row_attention.h"

#include "kernels/mla/amla.h"
#include "kernels/mla/flash_base.h"

namespace mlaserve {

void RunRowAttention(RescaleAlgorithm algorithm, const QueryRows& rows, KvBlockSource& kv,
                     float softmax_scale, RowOutputs out) {
  switch (algorithm) {
    case RescaleAlgorithm::kAmla:
      AmlaRows(rows, kv, softmax_scale, AmlaOptions{}, out);
      return;
    case RescaleAlgorithm::kBase:
      FlashBaseRows(rows, kv, softmax_scale, out);
      return;
  }
}

}  // namespace mlaserve
