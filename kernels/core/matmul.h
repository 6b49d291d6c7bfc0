#ifndef MLASERVE_KERNELS_CORE_MATMUL_H_
#define MLASERVE_KERNELS_CORE_MATMUL_H_

#include <cstdint>

namespace mlaserve {

// What the matrix unit computes, run on the host through OpenBLAS SGEMM.
//
// Operands hold bf16-representable values widened to fp32, so every product is exact in
// fp32 and only the accumulation rounds. The summation order is fixed by this definition:
//  * C is computed in output tiles of kMatrixTile x kMatrixTile (the cube's baseM x baseN),
//    tile (i, j) covering rows [128 i, ...) and columns [128 j, ...);
//  * the reduction axis is consumed in chunks of `k_chunk` (the L0 tile depth, e.g. baseK =
//    96 for Q K^T), each chunk's partial sum added to C in chunk order, as the cube
//    accumulates successive L0 tiles into L0C;
//  * each (tile, chunk) product is one single-threaded SGEMM call.
// OpenBLAS's order inside a call depends on the call's shape and threading, so fixing the
// calls is what lets the host kernels and the emulated device agree bit for bit. The first
// call switches OpenBLAS to one thread per call; mlaserve parallelises across tiles itself.
//
// All matrices are row-major with the given leading dimensions.

inline constexpr int kMatrixTile = 128;

// C[m][n] = (accumulate ? C : 0) + A[m][k] * B[n][k]^T
void MatmulNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk);

// C[m][n] = (accumulate ? C : 0) + A[m][k] * B[k][n]
void MatmulNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk);

// One tile of the above: a single SGEMM of an (m <= 128) x (n <= 128) block, what one MMAD
// sequence on the emulated cube runs.
void MatmulTileNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float* c, int64_t ldc, bool accumulate);
void MatmulTileNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float* c, int64_t ldc, bool accumulate);

// Plain fp64 GEMM, C = A * B^T, for golden references only.
void MatmulNTDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc);
// C = A * B, fp64.
void MatmulNNDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_MATMUL_H_
