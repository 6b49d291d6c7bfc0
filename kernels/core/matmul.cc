#include "kernels/core/matmul.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include <cblas.h>
#include <libxsmm.h>
#include <sys/mman.h>
#include <unistd.h>

// OpenBLAS's own worker pool (exported, used by its fork handler).
extern "C" int blas_thread_shutdown_(void);

namespace mlaserve {
namespace {

// Whether this process may turn written memory into code, which LIBXSMM's JIT needs. Under
// systemd's MemoryDenyWriteExecute= or the kernel's PR_SET_MDWE it may not, and LIBXSMM
// then hands out kernels that crash when called; the probe makes that a fallback instead.
bool CanMapGeneratedCode() {
  const long page = sysconf(_SC_PAGESIZE);
  void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = mprotect(p, page, PROT_READ | PROT_EXEC) == 0;
  munmap(p, page);
  return ok;
}

// LIBXSMM's initialisation, once per process; false when it must not be used.
bool LibxsmmUsable() {
  static const bool usable = [] {
    if (!CanMapGeneratedCode()) return false;
    libxsmm_init();
    return true;
  }();
  return usable;
}

void ZeroRows(int m, int n, float* c, int64_t ldc) {
  for (int i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
}

int ChunkOf(int k, int k_chunk) { return k_chunk > 0 ? k_chunk : std::max(k, 1); }

}  // namespace

void UseOneOpenBlasThreadPerCall() {
  static std::once_flag once;
  std::call_once(once, [] {
    openblas_set_num_threads(1);
    blas_thread_shutdown_();
  });
}

const char* MatrixUnitBackend() { return LibxsmmUsable() ? "libxsmm" : "openblas"; }

void MatmulTile(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                float* c, int64_t ldc) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  if (LibxsmmUsable()) {
    const float alpha = 1.0f, beta = 1.0f;
    const int flags = LIBXSMM_GEMM_FLAG_NONE;
    // LIBXSMM is column-major, where this call reads C^T = B^T A^T with no transposition:
    // B takes the first operand's place. A registry lookup after the first call per shape.
    const libxsmm_blasint first_ld = ldb, second_ld = lda, out_ld = ldc;
    const libxsmm_smmfunction kernel =
        libxsmm_smmdispatch(n, m, k, &first_ld, &second_ld, &out_ld, &alpha, &beta, &flags, nullptr);
    if (kernel != nullptr) {
      kernel(b, a, c);
      return;
    }
  }
  // No JIT in this process or for this shape: OpenBLAS, still one call per tile and chunk
  // (the same calls on every path, so host and device keep agreeing).
  UseOneOpenBlasThreadPerCall();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), 1.0f, c, static_cast<blasint>(ldc));
}

void MatmulNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk) {
  if (m <= 0 || n <= 0) return;
  if (!accumulate) ZeroRows(m, n, c, ldc);
  const int chunk = ChunkOf(k, k_chunk);
  for (int i = 0; i < m; i += kMatrixTile) {
    const int tm = std::min(kMatrixTile, m - i);
    for (int j = 0; j < n; j += kMatrixTile) {
      const int tn = std::min(kMatrixTile, n - j);
      for (int k0 = 0; k0 < k; k0 += chunk) {
        MatmulTile(tm, tn, std::min(chunk, k - k0), a + i * lda + k0, lda, b + k0 * ldb + j, ldb,
                   c + i * ldc + j, ldc);
      }
    }
  }
}

void MatmulNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk) {
  if (m <= 0 || n <= 0) return;
  const int chunk = ChunkOf(k, k_chunk);
  std::vector<float> a_t(static_cast<size_t>(std::max(k, 1)) * kMatrixTile);  // [k][tm]
  std::vector<float> c_t(static_cast<size_t>(kMatrixTile) * kMatrixTile);    // [tn][128]
  for (int i = 0; i < m; i += kMatrixTile) {
    const int tm = std::min(kMatrixTile, m - i);
    Transpose(tm, k, a + i * lda, lda, a_t.data(), tm);
    for (int j = 0; j < n; j += kMatrixTile) {
      const int tn = std::min(kMatrixTile, n - j);
      float* tile = c + i * ldc + j;
      if (accumulate) {
        Transpose(tm, tn, tile, ldc, c_t.data(), kMatrixTile);
      } else {
        ZeroRows(tn, tm, c_t.data(), kMatrixTile);
      }
      for (int k0 = 0; k0 < k; k0 += chunk) {
        MatmulTile(tn, tm, std::min(chunk, k - k0), b + j * ldb + k0, ldb, a_t.data() + k0 * tm, tm, c_t.data(),
                   kMatrixTile);
      }
      Transpose(tn, tm, c_t.data(), kMatrixTile, tile, ldc);
    }
  }
}

void Transpose(int rows, int cols, const float* in, int64_t ldi, float* out, int64_t ldo) {
  if (rows <= 0 || cols <= 0) return;
  UseOneOpenBlasThreadPerCall();
  cblas_somatcopy(CblasRowMajor, CblasTrans, rows, cols, 1.0f, in, static_cast<blasint>(ldi), out,
                  static_cast<blasint>(ldo));
}

void MatmulNTDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  UseOneOpenBlasThreadPerCall();
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), 0.0, c, static_cast<int>(ldc));
}

void MatmulNNDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  UseOneOpenBlasThreadPerCall();
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), 0.0, c, static_cast<int>(ldc));
}

}  // namespace mlaserve
