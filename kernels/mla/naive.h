#ifndef MLASERVE_KERNELS_MLA_NAIVE_H_
#define MLASERVE_KERNELS_MLA_NAIVE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/head_space_decode.h"
#include "kernels/core/latent_decode.h"
#include "kernels/core/up_projection.h"
#include "kernels/mla/row_attention.h"

namespace mlaserve {

// The naive formulation (docs/numerics.md, "The two MLA formulations"): expand the latent cache per
// head,
//   K[h] = [bf16(c_kv . W_UK[h]^T), k_pe]   (dn + dr = 192 wide)
//   V[h] =  bf16(c_kv . W_UV[h]^T)          (dv = 128 wide)
// and run ordinary multi-head attention with q[h] = [q_nope[h], q_pe[h]].

// Expands `n` latent token rows (fp32 [n][ld], c_kv then k_pe) for head h into
// k [n][dn + dr] and v [n][dv], rounded to bf16 as the expanded cache stores them.
void ExpandHeadKv(const float* latent, int64_t ld, int n, int dr, const UpProjection& w, int head,
                  Bf16* k, Bf16* v);

absl::StatusOr<AttentionOutput> NaiveDecode(const HeadSpaceDecodeProblem& p,
                                            RescaleAlgorithm algorithm = RescaleAlgorithm::kAmla);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_NAIVE_H_
