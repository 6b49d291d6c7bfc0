// Split-KV and prefix merges: partial results of the same rows over disjoint keys combined by
// their LSEs (CombineLseParts' definition), one warp a row, eight rows and one column slice a
// thread block (gpu::CombineTile). A row's part weights are computed once a slice (a lane a
// part) and kept in shared memory with the parts' addresses, so that the pass over the columns
// issues independent loads only, several parts' at a time.

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

  // Each lane holds 4-column vectors lane, lane + 32, ... of the slice (at most 4 of them: a
  // whole row of dv 512), and loads kPartsInFlight parts' vectors before it adds any, so that a
  // row of many parts waits out the memory's latency once a few parts, not once a part.
  constexpr int kMaxVectorsPerLane = gpu::kCombineMaxDv / 128;
  constexpr int kPartsInFlight = 8;
  float4 acc[kMaxVectorsPerLane];
#pragma unroll
  for (int v = 0; v < kMaxVectorsPerLane; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (m != -INFINITY) {
    for (int first = 0; first < j.num_parts; first += kPartsPerRound) {
      const int count = min(kPartsPerRound, j.num_parts - first);
      for (int p = lane; p < count; p += 32) {
        const float lse = lse_of(first + p);
        // A part of weight 0 (no keys) contributes exactly nothing: its rows are not read.
        weight[warp][p] = lse == -INFINITY ? 0.f : expf(lse - m) / total;
        rows_of[warp][p] = reinterpret_cast<const float*>(parts[first + p].out) +
                           static_cast<int64_t>(row) * j.dv + tile.col0;
      }
      __syncwarp();
#pragma unroll
      for (int v = 0; v < kMaxVectorsPerLane; ++v) {
        const int column = (lane + v * 32) * 4;
        if (column >= tile.cols) break;
        for (int p0 = 0; p0 < count; p0 += kPartsInFlight) {
          float w[kPartsInFlight];
          float4 x[kPartsInFlight];
#pragma unroll
          for (int i = 0; i < kPartsInFlight; ++i) {
            w[i] = p0 + i < count ? weight[warp][p0 + i] : 0.f;
            x[i] = w[i] != 0.f ? *reinterpret_cast<const float4*>(rows_of[warp][p0 + i] + column)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
          }
#pragma unroll
          for (int i = 0; i < kPartsInFlight; ++i) {
            acc[v].x += w[i] * x[i].x;
            acc[v].y += w[i] * x[i].y;
            acc[v].z += w[i] * x[i].z;
            acc[v].w += w[i] * x[i].w;
          }
        }
      }
      __syncwarp();
    }
  }
  // Every lane has read the parts' LSEs and rows: the destination may be the first part's own
  // (an in-place merge).
  __syncwarp();
#pragma unroll
  for (int v = 0; v < kMaxVectorsPerLane; ++v) {
    const int column = (lane + v * 32) * 4;
    if (column >= tile.cols) break;
    const float values[4] = {acc[v].x, acc[v].y, acc[v].z, acc[v].w};
    const int64_t at = static_cast<int64_t>(row) * j.out_stride + tile.col0 + column;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (j.out_bf16) {
        reinterpret_cast<__nv_bfloat16*>(j.out)[at + c] = __float2bfloat16_rn(values[c]);
      } else {
        reinterpret_cast<float*>(j.out)[at + c] = values[c];
      }
    }
  }
  if (lane == 0 && tile.col0 == 0) {
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
