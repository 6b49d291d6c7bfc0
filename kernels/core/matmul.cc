#include "kernels/core/matmul.h"

#include <algorithm>

#include <cblas.h>

namespace mlaserve {
namespace {

void ZeroRows(int m, int n, float* c, int64_t ldc) {
  for (int i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
}

}  // namespace

void MatmulNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk) {
  if (m <= 0 || n <= 0) return;
  if (!accumulate) ZeroRows(m, n, c, ldc);
  const int chunk = k_chunk > 0 ? k_chunk : std::max(k, 1);
  for (int k0 = 0; k0 < k; k0 += chunk) {
    const int kc = std::min(chunk, k - k0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, kc, 1.0f, a + k0, static_cast<int>(lda),
                b + k0, static_cast<int>(ldb), 1.0f, c, static_cast<int>(ldc));
  }
}

void MatmulNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk) {
  if (m <= 0 || n <= 0) return;
  if (!accumulate) ZeroRows(m, n, c, ldc);
  const int chunk = k_chunk > 0 ? k_chunk : std::max(k, 1);
  for (int k0 = 0; k0 < k; k0 += chunk) {
    const int kc = std::min(chunk, k - k0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, kc, 1.0f, a + k0,
                static_cast<int>(lda), b + k0 * ldb, static_cast<int>(ldb), 1.0f, c,
                static_cast<int>(ldc));
  }
}

void MatmulNTDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), 0.0, c, static_cast<int>(ldc));
}

void MatmulNNDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), 0.0, c, static_cast<int>(ldc));
}

}  // namespace mlaserve
