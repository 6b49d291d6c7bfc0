#ifndef MLASERVE_KERNELS_CORE_MATMUL_H_
#define MLASERVE_KERNELS_CORE_MATMUL_H_

#include <cstdint>

namespace mlaserve {

// What the matrix unit computes, run on the host through LIBXSMM's JIT-generated small-GEMM
// kernels (OpenBLAS SGEMM costs 1.05-1.6x more per 128 x 128 tile on these shapes: it packs
// both operands on every call; mlaserve-microbench and docs/performance.md have the figures).
//
// Operands hold bf16-representable values widened to fp32, so every product is exact in
// fp32 and only the accumulation rounds. The summation order is fixed by this definition:
//  * C is computed in output tiles of kMatrixTile x kMatrixTile (the cube's baseM x baseN),
//    tile (i, j) covering rows [128 i, ...) and columns [128 j, ...);
//  * the reduction axis is consumed in chunks of `k_chunk` (the L0 tile depth, e.g. baseK =
//    96 for Q K^T), in chunk order, each chunk one kernel call that accumulates into the
//    tile, as the cube accumulates successive L0 tiles into L0C;
//  * a kernel call is C[m][n] += A[m][k] B[k][n] with B's reduction axis outermost. An NT
//    product (B given [n][k]) is therefore formed transposed, C^T += B A^T, with A^T made
//    once per row tile: the layout the cube gets when MTE2 stores A transposed in L1, and
//    FIX transposes the finished tile back.
// What LIBXSMM does inside a call depends on the call's shape (it is not always one fused
// multiply-add chain per element), so fixing the calls is what lets the host kernels and the
// emulated device agree bit for bit.
//
// All matrices are row-major with the given leading dimensions.

inline constexpr int kMatrixTile = 128;

// C[m][n] = (accumulate ? C : 0) + A[m][k] * B[n][k]^T
void MatmulNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk);

// C[m][n] = (accumulate ? C : 0) + A[m][k] * B[k][n]
void MatmulNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk);

// One kernel call of the above: C[m][n] += A[m][k] B[k][n] with m, n <= 128, what one MMAD
// on the emulated cube runs. MatmulNT's tile (i, j) is MatmulTile(tn, tm, kc, B rows,
// A^T, C^T tile) per chunk, C^T held [tn][kMatrixTile].
void MatmulTile(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                float* c, int64_t ldc);

// What runs the matrix-unit calls in this process: "libxsmm", or "openblas" when generated
// code may not be mapped (systemd's MemoryDenyWriteExecute=, PR_SET_MDWE).
const char* MatrixUnitBackend();

// out[cols][rows] (leading dimension ldo) = in[rows][cols]^T (leading dimension ldi).
void Transpose(int rows, int cols, const float* in, int64_t ldi, float* out, int64_t ldo);

// Plain fp64 GEMM, C = A * B^T, for golden references only.
void MatmulNTDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc);
// C = A * B, fp64.
void MatmulNNDouble(int m, int n, int k, const double* a, int64_t lda, const double* b,
                    int64_t ldb, double* c, int64_t ldc);

// Makes every OpenBLAS call run single-threaded on its caller and stops OpenBLAS's own worker
// pool (idle, its threads would spin in sched_yield for a while after every call, stealing
// the cores mlaserve's threads work on). Idempotent; called before the first OpenBLAS call.
void UseOneOpenBlasThreadPerCall();

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_MATMUL_H_
