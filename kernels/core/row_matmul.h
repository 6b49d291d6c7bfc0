#ifndef MLASERVE_KERNELS_CORE_ROW_MATMUL_H_
#define MLASERVE_KERNELS_CORE_ROW_MATMUL_H_

#include <cstdint>

#include "kernels/core/bfloat16.h"

namespace mlaserve {

// The matrix unit's tile call for a few query rows (kernels/core/matmul.h routes every call
// of NN form with m <= kRowMatmulRows here, on every CPU, so host and device keep agreeing). A
// projection of one to a few queries multiplies each 32 KiB weight tile by a handful of rows: the
// work is reading the tile, and a library GEMM's per-call packing of B costs three times that
// (docs/performance.md 11.4). These read B once, in place.
//
// The sums are defined element by element, so every vector width gives the same bits:
// products of bf16 values are exact in fp32, so only the additions round, and their order is
// C[i][j] += A[i][kk] B[kk][j] for kk = 0, 1, ..., k - 1. A is compact [m][k], B compact
// [k][n] with n <= 128 (one output tile), C of leading dimension `ldc`. Up to 8 rows it stays
// ahead of the library (bench/micro: BM_RowMatmul_SmallRows beside
// BM_MatmulTileLibrary_SmallRows). Only the NN form: the projections read their weights as
// [k][n] tiles (matmul.h's PackMatrixTilesTransposed makes W_UV^T one), and an NT form sums
// across lanes, which measured no faster than the library from 2 rows.
inline constexpr int kRowMatmulRows = 8;

void RowMatmulNN(int m, int n, int k, const Bf16* a, const Bf16* b, float* c, int64_t ldc);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_ROW_MATMUL_H_
