#ifndef MLASERVE_KERNELS_MLA_ABSORB_H_
#define MLASERVE_KERNELS_MLA_ABSORB_H_

#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/head_space_decode.h"
#include "kernels/core/latent_decode.h"
#include "kernels/mla/row_attention.h"

namespace mlaserve {

// The absorb (latent MQA) formulation (docs/numerics.md, "The two MLA formulations"): fold W_UK
// into the query,
//   q_lat[h] = [bf16(q_nope[h] . W_UK[h]), q_pe[h]]                     (dl + dr wide)
// attend over the latent cache (values = c_kv), then map back to head space,
//   out[h] = bf16(o_lat[h]) . W_UV[h]^T                                  (dv wide).
// The bf16 casts are where a serving framework's bmm would round too.

// q_lat for every (request, token, head): [batch][sq][heads][dl + dr], from q_nope
// [batch][sq][heads][dn] and q_pe [batch][sq][heads][dr].
std::vector<Bf16> AbsorbQueries(const TensorView<const Bf16, 4>& q_nope,
                                const TensorView<const Bf16, 4>& q_pe, const UpProjection& w);

// out[r][h] = bf16(o_lat[r][h]) . W_UV[h]^T for `rows` (request, token) rows; o_lat is
// [rows][heads][dl] and out [rows][heads][dv].
void ProjectLatentOutputs(const UpProjection& w, int rows, const float* o_lat, float* out);

absl::StatusOr<AttentionOutput> AbsorbDecode(const HeadSpaceDecodeProblem& p,
                                             RescaleAlgorithm algorithm = RescaleAlgorithm::kAmla);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_ABSORB_H_
