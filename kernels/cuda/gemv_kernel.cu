// The row kernel: a projection launch whose jobs have a few rows (Launch::gemv_rows), as one
// sequence's absorb_q (1 x 128 by 128 x 512 a head) and project_out (1 x 512 by 512 x 128).
// The tiled GEMM (gemm_kernel.cu) spends a 64-row MMA tile on such a job and streams B
// through two 32-deep slices, so it waits on memory latency; here each thread block takes
// one GemmTile's 64 columns with the rows in registers and has every B vector of the tile
// in flight at once, so B is read once at memory bandwidth. Same records, same results up
// to fp32 summation order.

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_kernels.h"

namespace mlaserve::cuda {
namespace {

using gpu::GemmJob;
using gpu::GemmTile;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kCols = gpu::kGemmTileCols;
constexpr int kMaxDepth = gpu::kGemvMaxDepth;
constexpr int kVector = 8;  // bf16 values in 16 bytes

__device__ __forceinline__ void Widen(const uint4& v, float (&w)[kVector]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < kVector / 2; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    w[2 * i] = f.x;
    w[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ uint4 LoadStreaming(const __nv_bfloat16* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ void Store(const GemmJob& j, int row, int col, float v) {
  if (j.row_scale != 0) v *= reinterpret_cast<const float*>(j.row_scale)[row];
  const int64_t at = static_cast<int64_t>(row) * j.ldc + col;
  if (j.c_bf16) {
    reinterpret_cast<__nv_bfloat16*>(j.c)[at] = __float2bfloat16_rn(v);
  } else {
    reinterpret_cast<float*>(j.c)[at] = v;
  }
}

// B [k][n]: thread t takes the 8 columns (t % 8) of the tile at depths k = t / 8 + 32 i; the
// 32 depth groups are summed by shuffles within a warp, then across the warps in shared
// memory.
template <int R>
__device__ void RowsTimesB(const GemmJob& j, const GemmTile& tile, int rows, const float* a,
                           float (&partial)[kWarps][R][kCols]) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int vector = threadIdx.x % (kCols / kVector);
  const int depth_group = threadIdx.x / (kCols / kVector);
  constexpr int kDepthGroups = kThreads / (kCols / kVector);
  const int col = tile.col0 + vector * kVector;
  float acc[R][kVector] = {};
  if (col < j.n) {
    const auto* b = reinterpret_cast<const __nv_bfloat16*>(j.b) + col;
#pragma unroll 4
    for (int k = depth_group; k < j.k; k += kDepthGroups) {
      float w[kVector];
      Widen(LoadStreaming(b + static_cast<int64_t>(k) * j.ldb), w);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float ar = a[r * kMaxDepth + k];
#pragma unroll
        for (int e = 0; e < kVector; ++e) acc[r][e] += ar * w[e];
      }
    }
  }
  // Lanes l, l ^ 8, l ^ 16, l ^ 24 hold the same columns at other depths.
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int e = 0; e < kVector; ++e) {
      acc[r][e] += __shfl_xor_sync(0xffffffffu, acc[r][e], 8);
      acc[r][e] += __shfl_xor_sync(0xffffffffu, acc[r][e], 16);
    }
  }
  if (lane < kCols / kVector) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int e = 0; e < kVector; ++e) partial[warp][r][lane * kVector + e] = acc[r][e];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * kCols; i += kThreads) {
    const int r = i / kCols;
    const int c = i % kCols;
    if (tile.col0 + c >= j.n) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][r][c];
    Store(j, tile.row0 + r, tile.col0 + c, sum);
  }
}

// B [n][k]: warp w takes the tile's columns [8 w, 8 w + 8), each a row of B read along its
// depth 8 values a lane, and sums each dot product across the warp.
template <int R>
__device__ void RowsTimesBTransposed(const GemmJob& j, const GemmTile& tile, int rows,
                                     const float* a) {
  constexpr int kColsPerWarp = kCols / kWarps;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int col0 = tile.col0 + warp * kColsPerWarp;
  const auto* b = reinterpret_cast<const __nv_bfloat16*>(j.b);
  float acc[kColsPerWarp][R] = {};
  for (int k = lane * kVector; k < j.k; k += 32 * kVector) {
    uint4 raw[kColsPerWarp];
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) {
      raw[c] = col0 + c < j.n ? LoadStreaming(b + static_cast<int64_t>(col0 + c) * j.ldb + k)
                              : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) {
      float w[kVector];
      Widen(raw[c], w);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        // Two 16-byte reads a row: lanes 32 bytes apart then meet in a bank at most twice.
        const auto* ar = reinterpret_cast<const float4*>(a + r * kMaxDepth + k);
        const float4 lo = ar[0];
        const float4 hi = ar[1];
        acc[c][r] += lo.x * w[0] + lo.y * w[1] + lo.z * w[2] + lo.w * w[3] + hi.x * w[4] +
                     hi.y * w[5] + hi.z * w[6] + hi.w * w[7];
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        acc[c][r] += __shfl_xor_sync(0xffffffffu, acc[c][r], offset);
      }
    }
  }
  // Lane c * R + r stores (r, c): the stores spread over the warp.
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (lane == (c * R + r) % 32 && r < rows && col0 + c < j.n) {
        Store(j, tile.row0 + r, col0 + c, acc[c][r]);
      }
    }
  }
}

template <int R>
__global__ void __launch_bounds__(kThreads)
    GemvKernel(const GemmTile* __restrict__ tiles, const GemmJob* __restrict__ jobs) {
  __shared__ __align__(
      16) float a[R * kMaxDepth];  // the tile's rows, widened; rows past the job's are 0
  __shared__ float partial[kWarps][R][kCols];
  const GemmTile tile = tiles[blockIdx.x];
  const GemmJob j = jobs[tile.job];
  const int rows = min(R, j.rows - tile.row0);
  const auto* a_rows = reinterpret_cast<const __nv_bfloat16*>(j.a);
  for (int i = threadIdx.x; i < R * j.k; i += kThreads) {
    const int r = i / j.k;
    const int k = i % j.k;
    a[r * kMaxDepth + k] =
        r < rows ? __bfloat162float(a_rows[static_cast<int64_t>(tile.row0 + r) * j.lda + k]) : 0.f;
  }
  __syncthreads();
  if (j.transpose_b) {
    RowsTimesBTransposed<R>(j, tile, rows, a);
  } else {
    RowsTimesB<R>(j, tile, rows, a, partial);
  }
}

template <int R>
cudaError_t Enqueue(const gpu::Launch& launch, cudaStream_t stream) {
  GemvKernel<R>
      <<<launch.count, kThreads, 0, stream>>>(reinterpret_cast<const GemmTile*>(launch.tiles),
                                              reinterpret_cast<const GemmJob*>(launch.records));
  return cudaGetLastError();
}

}  // namespace

cudaError_t EnqueueGemv(const gpu::Launch& launch, cudaStream_t stream) {
  if (launch.gemv_rows <= 1) return Enqueue<1>(launch, stream);
  if (launch.gemv_rows <= 2) return Enqueue<2>(launch, stream);
  static_assert(gpu::kGemvMaxRows == 4);
  if (launch.gemv_rows <= 4) return Enqueue<4>(launch, stream);
  return cudaErrorInvalidValue;
}

}  // namespace mlaserve::cuda
