#include "kernels/mla/absorb.h"

#include <algorithm>

#include "common/status_macros.h"
#include "kernels/core/matmul.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/weights_fp32.h"

namespace mlaserve {

std::vector<Bf16> AbsorbQueries(const TensorView<const Bf16, 4>& q_nope_view,
                                const TensorView<const Bf16, 4>& q_pe_view, const UpProjection& w) {
  const int sq = static_cast<int>(q_nope_view.dim(1));
  const int heads = static_cast<int>(q_nope_view.dim(2));
  const int dn = w.dn(), dl = w.dl();
  const int dr = static_cast<int>(q_pe_view.dim(3));
  const int rows = static_cast<int>(q_nope_view.dim(0)) * sq;
  const int dk = dl + dr;
  std::vector<Bf16> q_lat(static_cast<size_t>(rows) * heads * dk);
  std::vector<float> q_nope(static_cast<size_t>(rows) * dn);
  std::vector<float> absorbed(static_cast<size_t>(rows) * dl);
  for (int h = 0; h < heads; ++h) {
    for (int r = 0; r < rows; ++r) {
      WidenBf16(q_nope_view.row(r / sq, r % sq, h), dn,
                q_nope.data() + static_cast<int64_t>(r) * dn);
    }
    const std::vector<float> w_uk = WidenHead(w.w_uk, h);  // [dn][dl]
    MatmulNN(rows, dl, dn, q_nope.data(), dn, w_uk.data(), dl, absorbed.data(), dl,
             /*accumulate=*/false, kProjectionDepthChunk);
    for (int r = 0; r < rows; ++r) {
      Bf16* dst = q_lat.data() + (static_cast<int64_t>(r) * heads + h) * dk;
      const float* src = absorbed.data() + static_cast<int64_t>(r) * dl;
      for (int d = 0; d < dl; ++d) dst[d] = Bf16::FromFloat(src[d]);
      std::copy_n(q_pe_view.row(r / sq, r % sq, h), dr, dst + dl);
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
                                             RescaleAlgorithm algorithm) {
  RETURN_IF_ERROR(ValidateHeadSpaceDecodeProblem(p));
  const int dk = p.dl() + p.dr();
  const std::vector<Bf16> q_lat = AbsorbQueries(p.q_nope, p.q_pe, p.weights);
  ASSIGN_OR_RETURN(auto q_view, (TensorView<const Bf16, 4>::Create(
                                    q_lat, {p.batch(), p.sq(), p.heads(), dk}, "q_lat")));
  const LatentDecodeProblem latent{q_view, p.cache, p.seqs, p.dl(), p.softmax_scale, p.causal};
  ASSIGN_OR_RETURN(AttentionOutput o_lat,
                   RunLatentDecode(latent, [&](const QueryRows& rows, KvBlockSource& kv,
                                               float scale, RowOutputs out) {
                     RunRowAttention(algorithm, rows, kv, scale, out);
                   }));
  AttentionOutput result;
  result.out.resize(static_cast<size_t>(p.batch()) * p.sq() * p.heads() * p.dv());
  ProjectLatentOutputs(p.weights, p.batch() * p.sq(), o_lat.out.data(), result.out.data());
  result.lse = std::move(o_lat.lse);
  return result;
}

}  // namespace mlaserve
