#include "kernels/mla/absorb.h"

#include <algorithm>

#include "kernels/core/matmul.h"
#include "kernels/core/status_macros.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/weights_fp32.h"

namespace mlaserve {

std::vector<Bf16> AbsorbQueries(const HeadSpaceDecodeProblem& p) {
  const int rows = p.batch() * p.sq();
  const int dk = p.dl() + p.dr();
  std::vector<Bf16> q_lat(static_cast<size_t>(rows) * p.heads() * dk);
  std::vector<float> q_nope(static_cast<size_t>(rows) * p.dn());
  std::vector<float> absorbed(static_cast<size_t>(rows) * p.dl());
  for (int h = 0; h < p.heads(); ++h) {
    for (int r = 0; r < rows; ++r) {
      WidenBf16(p.q_nope.row(r / p.sq(), r % p.sq(), h), p.dn(),
                q_nope.data() + static_cast<int64_t>(r) * p.dn());
    }
    const std::vector<float> w_uk = WidenHead(p.weights.w_uk, h);  // [dn][dl]
    MatmulNN(rows, p.dl(), p.dn(), q_nope.data(), p.dn(), w_uk.data(), p.dl(), absorbed.data(),
             p.dl(), /*accumulate=*/false, kProjectionDepthChunk);
    for (int r = 0; r < rows; ++r) {
      Bf16* dst = q_lat.data() + (static_cast<int64_t>(r) * p.heads() + h) * dk;
      const float* src = absorbed.data() + static_cast<int64_t>(r) * p.dl();
      for (int d = 0; d < p.dl(); ++d) dst[d] = Bf16::FromFloat(src[d]);
      std::copy_n(p.q_pe.row(r / p.sq(), r % p.sq(), h), p.dr(), dst + p.dl());
    }
  }
  return q_lat;
}

void ProjectLatentOutputs(const UpProjection& w, int rows, const float* o_lat, float* out) {
  const int heads = w.heads();
  std::vector<float> lhs(static_cast<size_t>(rows) * w.dl());
  std::vector<float> projected(static_cast<size_t>(rows) * w.dv());
  for (int h = 0; h < heads; ++h) {
    for (int r = 0; r < rows; ++r) {
      const float* src = o_lat + (static_cast<int64_t>(r) * heads + h) * w.dl();
      ScaleToBf16(src, w.dl(), 1.0f, lhs.data() + static_cast<int64_t>(r) * w.dl());
    }
    const std::vector<float> w_uv = WidenHead(w.w_uv, h);  // [dv][dl]
    MatmulNT(rows, w.dv(), w.dl(), lhs.data(), w.dl(), w_uv.data(), w.dl(), projected.data(),
             w.dv(), /*accumulate=*/false, kProjectionDepthChunk);
    for (int r = 0; r < rows; ++r) {
      std::copy_n(projected.data() + static_cast<int64_t>(r) * w.dv(), w.dv(),
                  out + (static_cast<int64_t>(r) * heads + h) * w.dv());
    }
  }
}

absl::StatusOr<AttentionOutput> AbsorbDecode(const HeadSpaceDecodeProblem& p,
                                             AttentionKernel kernel) {
  RETURN_IF_ERROR(ValidateHeadSpaceDecodeProblem(p));
  const int dk = p.dl() + p.dr();
  const std::vector<Bf16> q_lat = AbsorbQueries(p);
  ASSIGN_OR_RETURN(auto q_view, (TensorView<const Bf16, 4>::Create(
                                    q_lat, {p.batch(), p.sq(), p.heads(), dk}, "q_lat")));
  const LatentDecodeProblem latent{q_view, p.cache, p.seqs, p.dl(), p.softmax_scale, p.causal};
  ASSIGN_OR_RETURN(AttentionOutput o_lat,
                   RunLatentDecode(latent, [&](const QueryRows& rows, KvBlockSource& kv,
                                               float scale, RowOutputs out) {
                     RunAttentionRows(kernel, rows, kv, scale, out);
                   }));
  AttentionOutput result;
  result.out.resize(static_cast<size_t>(p.batch()) * p.sq() * p.heads() * p.dv());
  ProjectLatentOutputs(p.weights, p.batch() * p.sq(), o_lat.out.data(), result.out.data());
  result.lse = std::move(o_lat.lse);
  return result;
}

}  // namespace mlaserve
