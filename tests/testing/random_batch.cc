#include "tests/testing/random_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace mlaserve::testing {
namespace {

constexpr Bf16 kNanBf16 = Bf16::FromBits(0x7fc0);
constexpr int32_t kUnusedBlock = 2147480000;  // FlashMLA's filler for unused table slots

template <typename T, int N>
TensorView<const T, N> View(const std::vector<T>& v, std::array<int64_t, N> shape) {
  return *TensorView<const T, N>::Create(std::span<const T>(v), shape);
}

}  // namespace

RandomPagedBatch MakeRandomPagedBatch(const PagedBatchSpec& spec, Rng& rng) {
  RandomPagedBatch b;
  b.spec = spec;
  const int ps = spec.page_size;
  int used_pages = 0;
  for (int32_t len : spec.seqlens) {
    const int pages = (len + ps - 1) / ps;
    b.max_pages = std::max(b.max_pages, pages);
    used_pages += pages;
  }
  b.max_pages = std::max(b.max_pages, 1) + 1;  // one spare slot per row, never read
  b.num_pages = used_pages + 3;                // a few pages nobody owns
  b.q.resize(static_cast<size_t>(b.batch()) * spec.sq * spec.heads * spec.dk);
  FillNormal(b.q, spec.q_sigma, rng);
  b.pages.assign(static_cast<size_t>(b.num_pages) * ps * spec.dk, kNanBf16);

  std::vector<int32_t> order(b.num_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  b.block_table.assign(static_cast<size_t>(b.batch()) * b.max_pages, kUnusedBlock);
  int next = 0;
  for (int r = 0; r < b.batch(); ++r) {
    const int len = spec.seqlens[r];
    for (int j = 0; j * ps < len; ++j) {
      const int page = order[next++];
      b.block_table[static_cast<size_t>(r) * b.max_pages + j] = page;
      const int rows = std::min(ps, len - j * ps);
      std::span<Bf16> dst(b.pages.data() + static_cast<size_t>(page) * ps * spec.dk,
                          static_cast<size_t>(rows) * spec.dk);
      FillNormal(dst, spec.kv_sigma, rng);
    }
  }
  return b;
}

LatentDecodeProblem RandomPagedBatch::Latent(int dv, float scale, bool causal) const {
  return LatentDecodeProblem{
      View<Bf16, 4>(q, {batch(), spec.sq, spec.heads, spec.dk}),
      PagedKvCache{View<Bf16, 3>(pages, {num_pages, spec.page_size, spec.dk})},
      PagedSequences{View<int32_t, 2>(block_table, {batch(), max_pages}), spec.seqlens},
      dv,
      scale,
      causal};
}

RandomHeadSpaceBatch MakeRandomHeadSpaceBatch(const PagedBatchSpec& spec, Rng& rng, int dn, int dr,
                                              int dv) {
  RandomHeadSpaceBatch b;
  b.dn = dn;
  b.dr = dr;
  b.dl = spec.dk - dr;
  b.dv = dv;
  b.latent = MakeRandomPagedBatch(spec, rng);
  const size_t rows = static_cast<size_t>(b.latent.batch()) * spec.sq * spec.heads;
  b.q_nope.resize(rows * dn);
  b.q_pe.resize(rows * dr);
  FillNormal(b.q_nope, spec.q_sigma, rng);
  FillNormal(b.q_pe, spec.q_sigma, rng);
  // Scaled so that k_nope = c_kv W_UK^T has roughly unit variance, like a trained model's.
  const double w_sigma = 1.0 / std::sqrt(static_cast<double>(b.dl));
  b.w_uk.resize(static_cast<size_t>(spec.heads) * dn * b.dl);
  b.w_uv.resize(static_cast<size_t>(spec.heads) * dv * b.dl);
  FillNormal(b.w_uk, w_sigma, rng);
  FillNormal(b.w_uv, w_sigma, rng);
  return b;
}

UpProjection RandomHeadSpaceBatch::Weights() const {
  const int heads = latent.spec.heads;
  return UpProjection{View<Bf16, 3>(w_uk, {heads, dn, dl}), View<Bf16, 3>(w_uv, {heads, dv, dl})};
}

HeadSpaceDecodeProblem RandomHeadSpaceBatch::Problem(float scale, bool causal) const {
  const auto& s = latent.spec;
  const LatentDecodeProblem l = latent.Latent(dl, scale, causal);
  return HeadSpaceDecodeProblem{View<Bf16, 4>(q_nope, {latent.batch(), s.sq, s.heads, dn}),
                                View<Bf16, 4>(q_pe, {latent.batch(), s.sq, s.heads, dr}),
                                Weights(),
                                l.cache,
                                l.seqs,
                                scale,
                                causal};
}

}  // namespace mlaserve::testing
