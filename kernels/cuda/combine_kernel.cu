// Split-KV and prefix merges: partial results of the same rows over disjoint keys combined by
// their LSEs (CombineLseParts' definition), one warp a row, eight rows a thread block. A row's
// part weights are computed once (a lane a part) and kept in shared memory with the parts'
// addresses, so that the pass over the columns issues independent loads only.

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/cuda_kernels.h"

namespace mlaserve::cuda {
namespace {

using gpu::CombineJob;
using gpu::CombinePart;
using gpu::CombineTile;

constexpr int kRowsPerBlock = gpu::kCombineTileRows;
constexpr int kThreads = 32 * kRowsPerBlock;
// Parts whose weights fit in shared memory at once; a merge of more goes in rounds.
constexpr int kPartsPerRound = 128;

__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__global__ void __launch_bounds__(kThreads)
    CombineKernel(const CombineTile* __restrict__ tiles, const CombineJob* __restrict__ jobs) {
  __shared__ float weight[kRowsPerBlock][kPartsPerRound];
  __shared__ const float* rows_of[kRowsPerBlock][kPartsPerRound];
  const CombineTile tile = tiles[blockIdx.x];
  const CombineJob j = jobs[tile.job];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = tile.row0 + warp;
  if (row >= j.rows) return;
  const auto* parts = reinterpret_cast<const CombinePart*>(j.parts);
  const auto lse_of = [&](int p) { return reinterpret_cast<const float*>(parts[p].lse)[row]; };

  float m = -INFINITY;
  for (int p = lane; p < j.num_parts; p += 32) m = fmaxf(m, lse_of(p));
  m = WarpMax(m);
  float total = 0.f;
  if (m != -INFINITY) {
    for (int p = lane; p < j.num_parts; p += 32) total += expf(lse_of(p) - m);
  }
  total = WarpSum(total);

  // Each lane holds columns lane, lane + 32, ... (at most 16 of them for dv 512).
  constexpr int kMaxColumnsPerLane = gpu::kCombineMaxDv / 32;
  float acc[kMaxColumnsPerLane];
#pragma unroll
  for (int c = 0; c < kMaxColumnsPerLane; ++c) acc[c] = 0.f;
  if (m != -INFINITY) {
    for (int first = 0; first < j.num_parts; first += kPartsPerRound) {
      const int count = min(kPartsPerRound, j.num_parts - first);
      for (int p = lane; p < count; p += 32) {
        const float lse = lse_of(first + p);
        // A part of weight 0 (no keys) contributes exactly nothing.
        weight[warp][p] = lse == -INFINITY ? 0.f : expf(lse - m) / total;
        rows_of[warp][p] =
            reinterpret_cast<const float*>(parts[first + p].out) + static_cast<int64_t>(row) * j.dv;
      }
      __syncwarp();
      for (int p = 0; p < count; ++p) {
        const float w = weight[warp][p];
        if (w == 0.f) continue;
        const float* out = rows_of[warp][p];
#pragma unroll
        for (int c = 0; c < kMaxColumnsPerLane; ++c) {
          const int d = lane + c * 32;
          if (d < j.dv) acc[c] += w * out[d];
        }
      }
      __syncwarp();
    }
  }
  // Every lane has read the parts' LSEs and rows: the destination may be the first part's own
  // (an in-place merge).
  __syncwarp();
#pragma unroll
  for (int c = 0; c < kMaxColumnsPerLane; ++c) {
    const int d = lane + c * 32;
    if (d >= j.dv) break;
    const int64_t at = static_cast<int64_t>(row) * j.out_stride + d;
    if (j.out_bf16) {
      reinterpret_cast<__nv_bfloat16*>(j.out)[at] = __float2bfloat16_rn(acc[c]);
    } else {
      reinterpret_cast<float*>(j.out)[at] = acc[c];
    }
  }
  if (lane == 0) {
    reinterpret_cast<float*>(j.lse)[static_cast<int64_t>(row) * j.lse_stride] =
        m == -INFINITY ? -INFINITY : m + logf(total);
  }
}

}  // namespace

cudaError_t EnqueueCombine(const gpu::Launch& launch, cudaStream_t stream) {
  CombineKernel<<<launch.count, kThreads, 0, stream>>>(
      reinterpret_cast<const CombineTile*>(launch.tiles),
      reinterpret_cast<const CombineJob*>(launch.records));
  return cudaGetLastError();
}

}  // namespace mlaserve::cuda
