#include "kernels/reference/golden_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/status_macros.h"
#include "kernels/core/matmul.h"

namespace mlaserve {

GoldenOutput GoldenAttentionRows(std::span<const double> q, int count, int dk,
                                 std::span<const double> k, std::span<const double> v, int n,
                                 int dv, std::span<const int32_t> visible, double softmax_scale) {
  GoldenOutput g;
  g.out.assign(static_cast<size_t>(count) * dv, 0.0);
  g.lse.assign(count, -std::numeric_limits<double>::infinity());
  if (count == 0 || n == 0) return g;

  std::vector<double> s(static_cast<size_t>(count) * n);
  MatmulNTDouble(count, n, dk, q.data(), dk, k.data(), dk, s.data(), n);
  for (int i = 0; i < count; ++i) {
    double* row = s.data() + static_cast<int64_t>(i) * n;
    const int keys = std::clamp<int>(visible[i], 0, n);
    if (keys == 0) {
      std::fill(row, row + n, 0.0);
      continue;
    }
    double m = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < keys; ++j) m = std::max(m, row[j] * softmax_scale);
    double sum = 0.0;
    for (int j = 0; j < keys; ++j) {
      row[j] = std::exp(row[j] * softmax_scale - m);
      sum += row[j];
    }
    for (int j = 0; j < keys; ++j) row[j] /= sum;
    std::fill(row + keys, row + n, 0.0);
    g.lse[i] = m + std::log(sum);
  }
  MatmulNNDouble(count, dv, n, s.data(), n, v.data(), dv, g.out.data(), dv);
  return g;
}

absl::StatusOr<GoldenOutput> GoldenLatentDecode(const LatentDecodeProblem& p) {
  RETURN_IF_ERROR(ValidateLatentDecodeProblem(p));
  const int rows = p.sq() * p.heads();
  const int dk = p.dk();
  GoldenOutput result;
  result.out.reserve(static_cast<size_t>(p.batch()) * rows * p.dv);
  result.lse.reserve(static_cast<size_t>(p.batch()) * rows);

  for (int b = 0; b < p.batch(); ++b) {
    const int n = p.seqs.seqlens[b];
    std::vector<double> k(static_cast<size_t>(n) * dk), v(static_cast<size_t>(n) * p.dv);
    for (int t = 0; t < n; ++t) {
      const int page = p.seqs.block_table(b, t / p.cache.page_size());
      const Bf16* src = p.cache.pages.row(page, t % p.cache.page_size());
      for (int d = 0; d < dk; ++d) k[static_cast<size_t>(t) * dk + d] = src[d].ToFloat();
      for (int d = 0; d < p.dv; ++d) v[static_cast<size_t>(t) * p.dv + d] = src[d].ToFloat();
    }
    std::vector<double> q(static_cast<size_t>(rows) * dk);
    std::vector<int32_t> visible(rows);
    for (int s = 0; s < p.sq(); ++s) {
      for (int h = 0; h < p.heads(); ++h) {
        const int row = s * p.heads() + h;
        // Causal rule written out here rather than shared with the kernels.
        visible[row] = p.causal ? std::max(0, std::min(n, n - p.sq() + s + 1)) : n;
        const Bf16* src = p.q.row(b, s, h);
        for (int d = 0; d < dk; ++d) q[static_cast<size_t>(row) * dk + d] = src[d].ToFloat();
      }
    }
    GoldenOutput part = GoldenAttentionRows(q, rows, dk, k, v, n, p.dv, visible, p.softmax_scale);
    result.out.insert(result.out.end(), part.out.begin(), part.out.end());
    result.lse.insert(result.lse.end(), part.lse.begin(), part.lse.end());
  }
  return result;
}

absl::StatusOr<GoldenOutput> GoldenHeadSpaceDecode(const HeadSpaceDecodeProblem& p) {
  RETURN_IF_ERROR(ValidateHeadSpaceDecodeProblem(p));
  const int dn = p.dn(), dr = p.dr(), dl = p.dl(), dv = p.dv(), heads = p.heads();
  const int dk = dn + dr;
  GoldenOutput result;
  result.out.assign(static_cast<size_t>(p.batch()) * p.sq() * heads * dv, 0.0);
  result.lse.assign(static_cast<size_t>(p.batch()) * p.sq() * heads, 0.0);

  std::vector<std::vector<double>> w_uk(heads), w_uv(heads);  // [dn][dl], [dv][dl]
  for (int h = 0; h < heads; ++h) {
    w_uk[h].resize(static_cast<size_t>(dn) * dl);
    w_uv[h].resize(static_cast<size_t>(dv) * dl);
    for (int r = 0; r < dn; ++r)
      for (int c = 0; c < dl; ++c)
        w_uk[h][static_cast<size_t>(r) * dl + c] = p.weights.w_uk(h, r, c).ToFloat();
    for (int r = 0; r < dv; ++r)
      for (int c = 0; c < dl; ++c)
        w_uv[h][static_cast<size_t>(r) * dl + c] = p.weights.w_uv(h, r, c).ToFloat();
  }

  for (int b = 0; b < p.batch(); ++b) {
    const int n = p.seqs.seqlens[b];
    std::vector<double> c_kv(static_cast<size_t>(n) * dl), k_pe(static_cast<size_t>(n) * dr);
    for (int t = 0; t < n; ++t) {
      const int page = p.seqs.block_table(b, t / p.cache.page_size());
      const Bf16* src = p.cache.pages.row(page, t % p.cache.page_size());
      for (int d = 0; d < dl; ++d) c_kv[static_cast<size_t>(t) * dl + d] = src[d].ToFloat();
      for (int d = 0; d < dr; ++d) k_pe[static_cast<size_t>(t) * dr + d] = src[dl + d].ToFloat();
    }
    std::vector<int32_t> visible(p.sq());
    for (int s = 0; s < p.sq(); ++s) {
      visible[s] = p.causal ? std::max(0, std::min(n, n - p.sq() + s + 1)) : n;
    }
    std::vector<double> k(static_cast<size_t>(n) * dk), v(static_cast<size_t>(n) * dv);
    std::vector<double> k_nope(static_cast<size_t>(n) * dn);
    std::vector<double> q(static_cast<size_t>(p.sq()) * dk);
    for (int h = 0; h < heads; ++h) {
      MatmulNTDouble(n, dn, dl, c_kv.data(), dl, w_uk[h].data(), dl, k_nope.data(), dn);
      MatmulNTDouble(n, dv, dl, c_kv.data(), dl, w_uv[h].data(), dl, v.data(), dv);
      for (int t = 0; t < n; ++t) {
        std::copy_n(k_nope.data() + static_cast<size_t>(t) * dn, dn,
                    k.data() + static_cast<size_t>(t) * dk);
        std::copy_n(k_pe.data() + static_cast<size_t>(t) * dr, dr,
                    k.data() + static_cast<size_t>(t) * dk + dn);
      }
      for (int s = 0; s < p.sq(); ++s) {
        for (int d = 0; d < dn; ++d)
          q[static_cast<size_t>(s) * dk + d] = p.q_nope(b, s, h, d).ToFloat();
        for (int d = 0; d < dr; ++d)
          q[static_cast<size_t>(s) * dk + dn + d] = p.q_pe(b, s, h, d).ToFloat();
      }
      GoldenOutput part = GoldenAttentionRows(q, p.sq(), dk, k, v, n, dv, visible, p.softmax_scale);
      for (int s = 0; s < p.sq(); ++s) {
        const size_t row = (static_cast<size_t>(b) * p.sq() + s) * heads + h;
        std::copy_n(part.out.data() + static_cast<size_t>(s) * dv, dv,
                    result.out.data() + row * dv);
        result.lse[row] = part.lse[s];
      }
    }
  }
  return result;
}

}  // namespace mlaserve
