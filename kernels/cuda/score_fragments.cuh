#ifndef MLASERVE_KERNELS_CUDA_SCORE_FRAGMENTS_CUH_
#define MLASERVE_KERNELS_CUDA_SCORE_FRAGMENTS_CUH_

// The online softmax of a warpgroup MMA's score fragments, as the Hopper kernels that hold a
// key block's 64 x 64 scores in one warpgroup keep it (the seesaw and the expanded-heads
// kernels): a thread holds rows row and row + 8 of its warp's 16, keys 8 i + c2 + e at
// s[4 i + 2 h + e], so a row's scores lie in one quad and its maximum needs no shared memory.
// Scores kept as the MMA leaves them and scaled into base 2 inside the exponential; the output
// accumulators rescaled in registers (FlashAttention-2).

#include <cmath>
#include <cstdint>

#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/gpu/gpu_jobs.h"

namespace mlaserve::cuda::fragments {

// The running max starts finite so that exp2(old - new) is never (-inf) - (-inf); a block
// whose keys a row may not see reports kMasked, far below it, so it never moves the max.
constexpr float kMaxInit = -1e30f;
constexpr float kMasked = -1e33f;

// The thread's share of a block's scores s (64 rows x 64 keys; rows row and row + 8, keys
// 8 i + c2 + e at s[4 i + 2 h + e]), keys at or past a row's visible count masked to -inf; the
// scores stay as the MMA left them (Exponentiate applies the scale), the rows' maxima are
// returned in base 2 (scale_log2 > 0, so the maximum commutes with the scale; a row with no
// key left in the block gets kMasked).
__device__ __forceinline__ void MaskAndMax(float (&s)[32], float scale_log2, int block,
                                           const int (&visible)[2], int c2, float (&row_max)[2]) {
  const bool mask = (block + 1) * gpu::kAttentionBlockKeys > min(visible[0], visible[1]);
  row_max[0] = row_max[1] = -INFINITY;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = s[4 * i + 2 * h + e];
        if (mask && block * gpu::kAttentionBlockKeys + 8 * i + c2 + e >= visible[h]) v = -INFINITY;
        s[4 * i + 2 * h + e] = v;
        row_max[h] = fmaxf(row_max[h], v);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m = QuadMax(row_max[h]);
    row_max[h] = m == -INFINITY ? kMasked : m * scale_log2;
  }
}

// 2^x by the special function unit alone (results below 2^-126 flush to zero), not exp2f's
// longer sequence for subnormal results: the softmax's exponentials sit on the critical path.
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// s <- exp2(s x scale_log2 - base) per row, one fused multiply-add before the exponential
// (a masked -inf gives 0); returns the rows' sums (this thread's keys).
__device__ __forceinline__ void Exponentiate(float (&s)[32], float scale_log2,
                                             const float (&base)[2], float (&sum)[2]) {
  sum[0] = sum[1] = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = FastExp2(fmaf(s[4 * i + 2 * h + e], scale_log2, -base[h]));
        s[4 * i + 2 * h + e] = p;
        sum[h] += p;
      }
    }
  }
}

// The probabilities as the value product's A fragments (keys 16 j .. 16 j + 15 in p[j]).
__device__ __forceinline__ void PackProbabilities(const float (&s)[32], uint32_t (&p)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    p[j][0] = PackBf16(s[8 * j + 0], s[8 * j + 1]);
    p[j][1] = PackBf16(s[8 * j + 2], s[8 * j + 3]);
    p[j][2] = PackBf16(s[8 * j + 4], s[8 * j + 5]);
    p[j][3] = PackBf16(s[8 * j + 6], s[8 * j + 7]);
  }
}

template <int kN>
__device__ __forceinline__ void Rescale(float (&o)[kN], const float (&factor)[2]) {
  // Once a row's maximum settles, the factor is exactly 1: a warp whose rows all kept theirs
  // skips the multiplies.
  if (!__any_sync(0xffffffffu, factor[0] != 1.f || factor[1] != 1.f)) return;
#pragma unroll
  for (int i = 0; i < kN / 4; ++i) {
    o[i * 4 + 0] *= factor[0];
    o[i * 4 + 1] *= factor[0];
    o[i * 4 + 2] *= factor[1];
    o[i * 4 + 3] *= factor[1];
  }
}

template <int kN>
__device__ __forceinline__ void SettleRegisters(uint32_t (&r)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

}  // namespace mlaserve::cuda::fragments

#endif  // MLASERVE_KERNELS_CUDA_SCORE_FRAGMENTS_CUH_
