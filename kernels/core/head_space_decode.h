#ifndef MLASERVE_KERNELS_CORE_HEAD_SPACE_DECODE_H_
#define MLASERVE_KERNELS_CORE_HEAD_SPACE_DECODE_H_

#include "absl/status/status.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/core/tensor_view.h"
#include "kernels/core/up_projection.h"

namespace mlaserve {

// A batch of decode queries in head space (what the model's q projection produces:
// q_nope and RoPE'd q_pe per head) against a paged latent cache and the layer's
// up-projections. Outputs are per-head values (Dv wide), ready for o_proj.
struct HeadSpaceDecodeProblem {
  TensorView<const Bf16, 4> q_nope;  // [batch][sq][heads][dn]
  TensorView<const Bf16, 4> q_pe;    // [batch][sq][heads][dr]
  UpProjection weights;
  PagedKvCache cache;  // token rows: c_kv (dl) then k_pe (dr)
  PagedSequences seqs;
  float softmax_scale = 0.0f;
  bool causal = true;

  int batch() const { return static_cast<int>(q_nope.dim(0)); }
  int sq() const { return static_cast<int>(q_nope.dim(1)); }
  int heads() const { return static_cast<int>(q_nope.dim(2)); }
  int dn() const { return static_cast<int>(q_nope.dim(3)); }
  int dr() const { return static_cast<int>(q_pe.dim(3)); }
  int dl() const { return weights.dl(); }
  int dv() const { return weights.dv(); }
};

absl::Status ValidateHeadSpaceDecodeProblem(const HeadSpaceDecodeProblem& p);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_HEAD_SPACE_DECODE_H_
