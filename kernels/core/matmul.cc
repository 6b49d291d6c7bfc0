#include "kernels/core/matmul.h"

#include <algorithm>
#include <mutex>

#include <cblas.h>

// OpenBLAS's own worker pool (exported, used by its fork handler): with one thread per call
// the pool is never used again, but its idle workers spin in sched_yield for a while after
// every call, stealing the core from the threads doing the work.
extern "C" int blas_thread_shutdown_(void);

namespace mlaserve {
namespace {

// The defined summation order needs every SGEMM to run on its calling thread: OpenBLAS's
// in-call threading splits the work differently from call to call.
void UseOneBlasThreadPerCall() {
  static std::once_flag once;
  std::call_once(once, [] {
    openblas_set_num_threads(1);
    blas_thread_shutdown_();
  });
}

void ZeroRows(int m, int n, float* c, int64_t ldc) {
  for (int i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
}

template <bool kTransposeB>
void Tiled(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
           int64_t ldc, bool accumulate, int k_chunk) {
  if (m <= 0 || n <= 0) return;
  UseOneBlasThreadPerCall();
  if (!accumulate) ZeroRows(m, n, c, ldc);
  const int chunk = k_chunk > 0 ? k_chunk : std::max(k, 1);
  for (int i = 0; i < m; i += kMatrixTile) {
    const int tm = std::min(kMatrixTile, m - i);
    for (int j = 0; j < n; j += kMatrixTile) {
      const int tn = std::min(kMatrixTile, n - j);
      for (int k0 = 0; k0 < k; k0 += chunk) {
        const int kc = std::min(chunk, k - k0);
        const float* a_tile = a + i * lda + k0;
        const float* b_tile = kTransposeB ? b + j * ldb + k0 : b + k0 * ldb + j;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, kTransposeB ? CblasTrans : CblasNoTrans, tm, tn,
                    kc, 1.0f, a_tile, static_cast<int>(lda), b_tile, static_cast<int>(ldb), 1.0f,
                    c + i * ldc + j, static_cast<int>(ldc));
      }
    }
  }
}

}  // namespace

void MatmulNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk) {
  Tiled<true>(m, n, k, a, lda, b, ldb, c, ldc, accumulate, k_chunk);
}

void MatmulNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk) {
  Tiled<false>(m, n, k, a, lda, b, ldb, c, ldc, accumulate, k_chunk);
}

void MatmulTileNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float* c, int64_t ldc, bool accumulate) {
  Tiled<true>(m, n, k, a, lda, b, ldb, c, ldc, accumulate, 0);
}

void MatmulTileNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float* c, int64_t ldc, bool accumulate) {
  Tiled<false>(m, n, k, a, lda, b, ldb, c, ldc, accumulate, 0);
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
