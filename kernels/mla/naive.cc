#include "kernels/mla/naive.h"

#include <algorithm>
#include <vector>

#include "common/status_macros.h"
#include "kernels/core/kv_block_source.h"
#include "kernels/core/matmul.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/weights_fp32.h"

namespace mlaserve {

void ExpandHeadKv(const float* latent, int64_t ld, int n, int dr, const UpProjection& w, int head,
                  Bf16* k, Bf16* v) {
  const int dn = w.dn();
  const int dl = w.dl();
  const int dk = dn + dr;
  std::vector<float> k_nope(static_cast<size_t>(n) * dn);
  std::vector<float> values(static_cast<size_t>(n) * w.dv());
  const std::vector<float> w_uk = WidenHead(w.w_uk, head);  // [dn][dl]
  const std::vector<float> w_uv = WidenHead(w.w_uv, head);  // [dv][dl]
  MatmulNT(n, dn, dl, latent, ld, w_uk.data(), dl, k_nope.data(), dn, /*accumulate=*/false,
           kProjectionDepthChunk);
  MatmulNT(n, w.dv(), dl, latent, ld, w_uv.data(), dl, values.data(), w.dv(), /*accumulate=*/false,
           kProjectionDepthChunk);
  for (int t = 0; t < n; ++t) {
    Bf16* k_row = k + static_cast<int64_t>(t) * dk;
    for (int d = 0; d < dn; ++d)
      k_row[d] = Bf16::FromFloat(k_nope[static_cast<size_t>(t) * dn + d]);
    // k_pe is already bf16: widening and narrowing again is exact.
    for (int d = 0; d < dr; ++d) k_row[dn + d] = Bf16::FromFloat(latent[t * ld + dl + d]);
    Bf16* v_row = v + static_cast<int64_t>(t) * w.dv();
    for (int d = 0; d < w.dv(); ++d)
      v_row[d] = Bf16::FromFloat(values[static_cast<size_t>(t) * w.dv() + d]);
  }
}

absl::StatusOr<AttentionOutput> NaiveDecode(const HeadSpaceDecodeProblem& p,
                                            RescaleAlgorithm algorithm) {
  RETURN_IF_ERROR(ValidateHeadSpaceDecodeProblem(p));
  const int width = p.cache.width();
  const int dk = p.dn() + p.dr();
  AttentionOutput result;
  result.out.resize(static_cast<size_t>(p.batch()) * p.sq() * p.heads() * p.dv());
  result.lse.resize(static_cast<size_t>(p.batch()) * p.sq() * p.heads());

  std::vector<float> q(static_cast<size_t>(p.sq()) * dk);
  std::vector<int32_t> visible(p.sq());
  std::vector<float> out(static_cast<size_t>(p.sq()) * p.dv());
  std::vector<float> lse(p.sq());
  for (int b = 0; b < p.batch(); ++b) {
    const int n = p.seqs.seqlens[b];
    std::vector<float> latent(static_cast<size_t>(n) * width);
    for (int t = 0; t < n; ++t) {
      WidenBf16(TokenRow(p.cache, p.seqs, b, t), width,
                latent.data() + static_cast<int64_t>(t) * width);
    }
    std::vector<Bf16> k(static_cast<size_t>(n) * dk), v(static_cast<size_t>(n) * p.dv());
    for (int s = 0; s < p.sq(); ++s) visible[s] = VisibleKeys(n, p.sq(), s, p.causal);
    for (int h = 0; h < p.heads(); ++h) {
      ExpandHeadKv(latent.data(), width, n, p.dr(), p.weights, h, k.data(), v.data());
      for (int s = 0; s < p.sq(); ++s) {
        WidenBf16(p.q_nope.row(b, s, h), p.dn(), q.data() + static_cast<int64_t>(s) * dk);
        WidenBf16(p.q_pe.row(b, s, h), p.dr(), q.data() + static_cast<int64_t>(s) * dk + p.dn());
      }
      DenseKvSource source(k.data(), dk, dk, v.data(), p.dv(), p.dv(), n);
      RunRowAttention(algorithm, QueryRows{q.data(), dk, p.sq(), dk, visible}, source,
                      p.softmax_scale, RowOutputs{out.data(), p.dv(), lse.data()});
      for (int s = 0; s < p.sq(); ++s) {
        const int64_t row = (static_cast<int64_t>(b) * p.sq() + s) * p.heads() + h;
        std::copy_n(out.data() + static_cast<int64_t>(s) * p.dv(), p.dv(),
                    result.out.data() + row * p.dv());
        result.lse[row] = lse[s];
      }
    }
  }
  return result;
}

}  // namespace mlaserve
