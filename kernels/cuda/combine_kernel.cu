// Split-KV and prefix merges: partial results of the same rows over disjoint keys combined by
// their LSEs (CombineLseParts' definition), one warp a row, eight rows a thread block.

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/cuda_kernels.h"

namespace mlaserve::cuda {
namespace {

using gpu::CombineJob;
using gpu::CombinePart;
using gpu::CombineTile;

constexpr int kThreads = 32 * gpu::kCombineTileRows;

__global__ void __launch_bounds__(kThreads)
    CombineKernel(const CombineTile* __restrict__ tiles, const CombineJob* __restrict__ jobs) {
  const CombineTile tile = tiles[blockIdx.x];
  const CombineJob j = jobs[tile.job];
  const int row = tile.row0 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= j.rows) return;
  const auto* parts = reinterpret_cast<const CombinePart*>(j.parts);
  float m = -INFINITY;
  for (int p = 0; p < j.num_parts; ++p) {
    m = fmaxf(m, reinterpret_cast<const float*>(parts[p].lse)[row]);
  }
  float total = 0.f;
  if (m != -INFINITY) {
    for (int p = 0; p < j.num_parts; ++p) {
      total += expf(reinterpret_cast<const float*>(parts[p].lse)[row] - m);
    }
  }
  for (int d = lane; d < j.dv; d += 32) {
    float acc = 0.f;
    if (m != -INFINITY) {
      for (int p = 0; p < j.num_parts; ++p) {
        const float lse = reinterpret_cast<const float*>(parts[p].lse)[row];
        if (lse == -INFINITY) continue;  // weight 0: contributes exactly nothing
        acc += expf(lse - m) / total *
               reinterpret_cast<const float*>(parts[p].out)[static_cast<int64_t>(row) * j.dv + d];
      }
    }
    const int64_t at = static_cast<int64_t>(row) * j.out_stride + d;
    if (j.out_bf16) {
      reinterpret_cast<__nv_bfloat16*>(j.out)[at] = __float2bfloat16_rn(acc);
    } else {
      reinterpret_cast<float*>(j.out)[at] = acc;
    }
  }
  // Every lane has read the parts' LSEs before lane 0 writes: the destination may be the
  // first part's own (an in-place merge).
  __syncwarp();
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
