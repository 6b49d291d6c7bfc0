#ifndef MLASERVE_KERNELS_CORE_MATMUL_H_
#define MLASERVE_KERNELS_CORE_MATMUL_H_

#include <cstdint>

namespace mlaserve {

// What the matrix unit computes, run on the host through OpenBLAS SGEMM.
//
// Operands hold bf16-representable values widened to fp32, so every product is exact in
// fp32 and only the accumulation rounds. The reduction axis is consumed in chunks of
// `k_chunk` (the L0 tile depth, e.g. baseK = 96 for Q·K^T); each chunk's partial sum is
// added to C in chunk order, as the cube accumulates successive L0 tiles into L0C. Fixing
// this order is what lets the host reference and the emulated device agree bit for bit.
//
// All matrices are row-major with the given leading dimensions.

// C[m][n] = (accumulate ? C : 0) + A[m][k] * B[n][k]^T
void MatmulNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk);

// C[m][n] = (accumulate ? C : 0) + A[m][k] * B[k][n]
void MatmulNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk);

// Plain fp64 GEMM, C = A * B^T, for golden references only.
void MatmulNTDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc);
// C = A * B, fp64.
void MatmulNNDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_MATMUL_H_
