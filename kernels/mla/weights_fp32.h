#ifndef MLASERVE_KERNELS_MLA_WEIGHTS_FP32_H_
#define MLASERVE_KERNELS_MLA_WEIGHTS_FP32_H_

#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/tensor_view.h"
#include "kernels/core/vector_ops.h"

namespace mlaserve {

// One head's weight matrix ([rows][cols] of a [heads][rows][cols] tensor) widened to fp32
// for the matrix unit.
inline std::vector<float> WidenHead(const TensorView<const Bf16, 3>& w, int head) {
  const int rows = static_cast<int>(w.dim(1));
  const int cols = static_cast<int>(w.dim(2));
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    WidenBf16(w.row(head, r), cols, out.data() + static_cast<int64_t>(r) * cols);
  }
  return out;
}

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_WEIGHTS_FP32_H_
