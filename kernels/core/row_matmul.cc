#include "kernels/core/row_matmul.h"

#include <algorithm>

#include <immintrin.h>

namespace mlaserve {
namespace {

#if defined(__AVX512F__)
// 16 bf16 values widened to fp32 (exact: the bits shifted into the high half).
inline __m512 Widen16(const Bf16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  // The zero-masked forms: GCC 12 warns about the plain ones' undefined pass-through.
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, bits), 16));
}

// How far ahead of the row being multiplied the weights are fetched (16 rows: 4 KiB of a
// 128-column tile; past the tile's end it fetches what the next call reads, or nothing).
constexpr int kPrefetchRows = 16;

// Columns [j, j + 16 * kStrips) of kRows rows, kept in registers over the whole depth.
template <int kRows, int kStrips>
void NNStrips(int n, int k, const Bf16* a, const Bf16* b, float* c, int64_t ldc, int j) {
  __m512 acc[kRows][kStrips] = {};
  static_assert(kRows <= 4);
  for (int i = 0; i < kRows; ++i)
    for (int s = 0; s < kStrips; ++s) acc[i][s] = _mm512_loadu_ps(c + i * ldc + j + 16 * s);
  for (int kk = 0; kk < k; ++kk) {
    // A weight tile is read once, row by row at a stride of n: the hardware prefetcher alone
    // left single-row projections at about half the machine's streaming rate.
    const Bf16* ahead = b + static_cast<int64_t>(kk + kPrefetchRows) * n + j;
    for (int s = 0; s < kStrips; s += 2) _mm_prefetch(ahead + 16 * s, _MM_HINT_T0);
    __m512 row[kStrips] = {};
    for (int s = 0; s < kStrips; ++s)
      row[s] = Widen16(b + static_cast<int64_t>(kk) * n + j + 16 * s);
    for (int i = 0; i < kRows; ++i) {
      const __m512 x = _mm512_set1_ps(a[static_cast<int64_t>(i) * k + kk].ToFloat());
      for (int s = 0; s < kStrips; ++s) acc[i][s] = _mm512_fmadd_ps(x, row[s], acc[i][s]);
    }
  }
  for (int i = 0; i < kRows; ++i)
    for (int s = 0; s < kStrips; ++s) _mm512_storeu_ps(c + i * ldc + j + 16 * s, acc[i][s]);
}

// All whole 16-column strips of kRows rows; returns the first column left.
template <int kRows>
int NNColumns(int n, int k, const Bf16* a, const Bf16* b, float* c, int64_t ldc) {
  // Strips in registers: kRows x kWide accumulators. One or two rows take a whole 128-column
  // row of the tile at once (a sequential read, eight independent sums).
  constexpr int kWide = kRows <= 2 ? 8 : 4;
  int j = 0;
  for (; j + 16 * kWide <= n; j += 16 * kWide) NNStrips<kRows, kWide>(n, k, a, b, c, ldc, j);
  for (; j + 16 <= n; j += 16) NNStrips<kRows, 1>(n, k, a, b, c, ldc, j);
  return j;
}

// Rows in blocks of at most four (2 x 4 accumulators beat 1 x 8 on register pressure).
int NNVector(int m, int n, int k, const Bf16* a, const Bf16* b, float* c, int64_t ldc) {
  int j = n;
  for (int i = 0; i < m; i += 4) {
    const Bf16* ai = a + static_cast<int64_t>(i) * k;
    float* ci = c + i * ldc;
    switch (std::min(4, m - i)) {
      case 1:
        j = NNColumns<1>(n, k, ai, b, ci, ldc);
        break;
      case 2:
        j = NNColumns<2>(n, k, ai, b, ci, ldc);
        break;
      case 3:
        j = NNColumns<3>(n, k, ai, b, ci, ldc);
        break;
      default:
        j = NNColumns<4>(n, k, ai, b, ci, ldc);
        break;
    }
  }
  return j;
}
#endif

}  // namespace

void RowMatmulNN(int m, int n, int k, const Bf16* a, const Bf16* b, float* c, int64_t ldc) {
  int j = 0;
#if defined(__AVX512F__)
  // Products are exact, so the fused multiply-add rounds once per addition, as the
  // definition's loop below does.
  j = NNVector(m, n, k, a, b, c, ldc);
#endif
  for (int kk = 0; kk < k && j < n; ++kk) {
    const Bf16* b_row = b + static_cast<int64_t>(kk) * n;
    for (int i = 0; i < m; ++i) {
      const float x = a[static_cast<int64_t>(i) * k + kk].ToFloat();
      float* c_row = c + i * ldc;
      for (int jj = j; jj < n; ++jj) c_row[jj] += x * b_row[jj].ToFloat();
    }
  }
}

}  // namespace mlaserve
