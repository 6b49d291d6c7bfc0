#ifndef MLASERVE_KERNELS_CORE_MATMUL_H_
#define MLASERVE_KERNELS_CORE_MATMUL_H_

#include <cstdint>
#include <string>

#include "kernels/core/bfloat16.h"

namespace mlaserve {

// What the matrix unit computes, run on the host as oneDNN bf16 matmuls (on the CPU's AMX
// matrix engine where it has one): bf16 operands, fp32 accumulation, as the cube's MMAD.
// Products of bf16 values are exact in fp32; only the accumulation rounds, and the order is
// fixed by this definition:
//  * C is computed in output tiles of kMatrixTile x kMatrixTile (the cube's baseM x baseN),
//    tile (i, j) covering rows [128 i, ...) and columns [128 j, ...), accumulated in an
//    L0C-like tile of leading dimension kMatrixTile;
//  * the reduction axis is consumed in chunks of `k_chunk` (the L0 tile depth, e.g. baseK =
//    96 for Q K^T), in chunk order, each chunk one tile call that adds into the tile, as the
//    cube accumulates successive L0 tiles into L0C;
//  * a tile call takes its operands compact: A [m][k], and B [k][n] (NN) or [n][k] (NT).
// oneDNN picks its kernel, and with it the order of the sum inside a call, from the call's
// whole layout, so fixing the calls is what lets the host kernels and the emulated device
// (whose L1 buffers hold exactly these compact operands) agree bit for bit.
//
// The fp32 entry points take bf16-valued fp32 matrices, row-major with the given leading
// dimensions (narrowed to bf16 per chunk, exact).

inline constexpr int kMatrixTile = 128;

// C[m][n] = (accumulate ? C : 0) + A[m][k] * B[n][k]^T
void MatmulNT(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk);

// C[m][n] = (accumulate ? C : 0) + A[m][k] * B[k][n]
void MatmulNN(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc, bool accumulate, int k_chunk);

// The same with bf16 operands, read in place (nothing widened): B is [k][n], or [n][k] if
// `b_transposed`. Bit for bit what MatmulNN / MatmulNT give for the widened operands.
void MatmulBf16(bool b_transposed, int m, int n, int k, const Bf16* a, int64_t lda, const Bf16* b,
                int64_t ldb, float* c, int64_t ldc, bool accumulate, int k_chunk);

// The same with B given row by row: b_rows[i] points at row i of B ([n][k] if b_transposed,
// [k][n] otherwise), so B can be rows scattered over a paged cache, read in place.
void MatmulBf16Rows(bool b_transposed, int m, int n, int k, const Bf16* a, int64_t lda,
                    const Bf16* const* b_rows, float* c, int64_t ldc, bool accumulate, int k_chunk);

// The matrix unit's layout of a weight matrix (Ascend's fractal layout, FlashMLA's and
// oneDNN's pre-packed weights play the same part): a [rows][cols] matrix stored as column
// blocks of kMatrixTile, block b holding columns [128 b, 128 b + w_b) as a compact
// [rows][w_b] matrix at b * rows * 128. Every operand a tile call takes from such a matrix,
// as B of [k][n] (blocks of output columns) or of [n][k] (blocks of depth, k_chunk 128), is
// then one contiguous run: nothing to copy or convert per call. Packed once, when weights
// are loaded.
void PackMatrixTiles(const Bf16* src, int64_t ld, int rows, int cols, Bf16* dst);
// The same layout for the transpose of src ([cols][rows] packed): a weight used as B^T
// becomes an NN operand, whose few-row tile calls are the faster ones (row_matmul.h).
void PackMatrixTilesTransposed(const Bf16* src, int64_t ld, int rows, int cols, Bf16* dst);

// MatmulBf16 with B packed by PackMatrixTiles ([k][n], or [n][k] if b_transposed) and the
// depth chunk kMatrixTile: the same tile calls on the same operands, so the same bits, read
// in place.
void MatmulBf16Tiled(bool b_transposed, int m, int n, int k, const Bf16* a, int64_t lda,
                     const Bf16* b_tiles, float* c, int64_t ldc, bool accumulate);

// One tile call: C[m][n] += A[m][k] . B with m, n <= 128, A compact [m][k], B compact [k][n]
// (NN) or [n][k] (NT), C of leading dimension kMatrixTile. What one MMAD of the emulated
// cube runs.
void MatmulTileNN(int m, int n, int k, const Bf16* a, const Bf16* b, float* c);
void MatmulTileNT(int m, int n, int k, const Bf16* a, const Bf16* b, float* c);
// The library's tile call (oneDNN, or OpenBLAS) whatever the rows, which the matrix unit
// itself no longer makes for a few rows: for benchmarks that set the row kernel beside it.
void MatmulTileLibraryNN(int m, int n, int k, const Bf16* a, const Bf16* b, float* c);

// What runs the matrix-unit calls in this process: "oneDNN <implementation>" (chosen by
// oneDNN for the CPU: AMX, AVX-512 BF16 or AVX-512), or "OpenBLAS (<why>)": on CPUs without
// AVX-512, when generated code may not be mapped (systemd's MemoryDenyWriteExecute=,
// PR_SET_MDWE), or when MLASERVE_MATRIX_UNIT=openblas asks for it; then "; few rows: ...":
// tile calls of a few rows take the row kernel (row_matmul.h) on every path. Within a process
// every caller gets the same backend, so host and device keep agreeing bit for bit.
std::string MatrixUnitBackend();

// "matrix unit: <MatrixUnitBackend()>; CPU: <model>, <matrix ISA>": what --version reports,
// since the same binary computes on different paths on different machines.
std::string MatrixPathDescription();

// Plain fp64 GEMM, C = A * B^T, for golden references only.
void MatmulNTDouble(int m, int n, int k, const double* a, int64_t lda, const double* b, int64_t ldb,
                    double* c, int64_t ldc);
// C = A * B, fp64.
void MatmulNNDouble(int m, int n, int k, const double* a, int64_t lda, const double* b, int64_t ldb,
                    double* c, int64_t ldc);

// Makes every OpenBLAS call run single-threaded on its caller and stops OpenBLAS's own worker
// pool (idle, its threads would spin in sched_yield for a while after every call, stealing
// the cores mlaserve's threads work on). Idempotent; called before the first OpenBLAS call.
void UseOneOpenBlasThreadPerCall();

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_MATMUL_H_
