#ifndef MLASERVE_KERNELS_CORE_UP_PROJECTION_H_
#define MLASERVE_KERNELS_CORE_UP_PROJECTION_H_

#include "kernels/core/bfloat16.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve {

// One layer's MLA up-projections, split per head from DeepSeek's kv_b_proj
// ([H * (Dn + Dv)] x Dl, rows per head: Dn of W_UK then Dv of W_UV).
struct UpProjection {
  TensorView<const Bf16, 3> w_uk;  // [heads][dn][dl]: k_nope[h] = c_kv . W_UK[h]^T
  TensorView<const Bf16, 3> w_uv;  // [heads][dv][dl]: v[h]      = c_kv . W_UV[h]^T

  int heads() const { return static_cast<int>(w_uk.dim(0)); }
  int dn() const { return static_cast<int>(w_uk.dim(1)); }
  int dl() const { return static_cast<int>(w_uk.dim(2)); }
  int dv() const { return static_cast<int>(w_uv.dim(1)); }
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_UP_PROJECTION_H_
