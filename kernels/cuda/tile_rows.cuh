#ifndef MLASERVE_KERNELS_CUDA_TILE_ROWS_CUH_
#define MLASERVE_KERNELS_CUDA_TILE_ROWS_CUH_

// The online softmax of an attention tile's rows as both attention kernels keep it: a thread
// holds two rows of the MMA fragments (r and r + 8), shared with the other warps that hold the
// same rows' other keys and columns (kSlots of them), which exchange their per-row values
// through shared memory `red` ([kSlots][kAttentionTileRows] floats). Scores are in base 2
// (pre-multiplied by scale * log2 e); the LSE written is natural-log.

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/gpu/gpu_jobs.h"

namespace mlaserve::cuda {

// Bytes between rows staged for TileRows::Stage: a row of `columns` outputs and 16 (bf16) or
// 32 (fp32) bytes more, so that the eight rows a warp's fragments cover fall in different banks.
__host__ __device__ constexpr int StagedRowBytes(int columns, bool bf16) {
  return bf16 ? columns * 2 + 16 : columns * 4 + 32;
}

template <int kSlots>
struct TileRows {
  static constexpr int kRows = gpu::kAttentionTileRows;
  static constexpr float kLn2 = 0.6931471805599453f;

  int row[2];
  int slot;  // which of the kSlots warps sharing the rows this thread's is
  int lane;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  __device__ TileRows(int first_row, int slot_, int lane_)
      : row{first_row, first_row + 8}, slot(slot_), lane(lane_) {}

  // From this thread's maxima of a block's scores: every row's new base (0 for a row that has
  // seen no key yet, so exp2(-inf - 0) = 0, never NaN) and the factor its output and sum are
  // rescaled by. All threads must call it (a barrier).
  __device__ void Advance(float max0, float max1, float* red, float base[2], float alpha[2]) {
    max0 = QuadMax(max0);
    max1 = QuadMax(max1);
    if ((lane & 3) == 0) {
      red[slot * kRows + row[0]] = max0;
      red[slot * kRows + row[1]] = max1;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float block = red[row[i]];
#pragma unroll
      for (int w = 1; w < kSlots; ++w) block = fmaxf(block, red[w * kRows + row[i]]);
      const float m_new = fmaxf(m[i], block);
      base[i] = m_new == -INFINITY ? 0.f : m_new;
      alpha[i] = exp2f(m[i] - base[i]);
      m[i] = m_new;
    }
  }

  // This thread's sums of the block's probabilities, after Advance.
  __device__ void Accumulate(float sum0, float sum1, const float alpha[2]) {
    l[0] = l[0] * alpha[0] + sum0;
    l[1] = l[1] * alpha[1] + sum1;
  }

  // Every row's total over all its keys: the quad's, then the slots'. All threads must call
  // it (barriers; `red` free again before the first).
  __device__ void Totals(float* red, float total[2]) {
    const float l0 = QuadSum(l[0]);
    const float l1 = QuadSum(l[1]);
    __syncthreads();
    if ((lane & 3) == 0) {
      red[slot * kRows + row[0]] = l0;
      red[slot * kRows + row[1]] = l1;
    }
    __syncthreads();
    total[0] = total[1] = 0.f;
#pragma unroll
    for (int w = 0; w < kSlots; ++w) {
      total[0] += red[w * kRows + row[0]];
      total[1] += red[w * kRows + row[1]];
    }
  }

  // The normalised outputs of the thread's rows within the tile: value(i, h, e) is the
  // unnormalised element e of 8-column block i in row h, at column col0 + 8 i + 2 (lane % 4)
  // + e; the LSE from the slot-0 warps.
  template <int kBlocks, class Value>
  __device__ void Store(const gpu::AttentionTile& t, const float total[2], int col0,
                        Value value) const {
    ForEachPair<kBlocks>(t, total, col0, value, [&](int h, int col, float v0, float v1) {
      if (t.out_bf16) {
        __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(t.out) + row[h] * t.out_stride + col;
        out[0] = __float2bfloat16_rn(v0);
        out[1] = __float2bfloat16_rn(v1);
      } else {
        float* out = reinterpret_cast<float*>(t.out) + row[h] * t.out_stride + col;
        out[0] = v0;
        out[1] = v1;
      }
    });
    StoreLse(t, total);
  }

  // Store's outputs into shared memory instead (the LSE apart), row r at stage + r * stride
  // bytes in the output's type, for the caller to copy out as whole rows (StagedRowBytes).
  template <int kBlocks, class Value>
  __device__ void Stage(const gpu::AttentionTile& t, const float total[2], int col0, Value value,
                        uint32_t stage, int stride) const {
    ForEachPair<kBlocks>(t, total, col0, value, [&](int h, int col, float v0, float v1) {
      const uint32_t at = stage + static_cast<uint32_t>(row[h] * stride);
      if (t.out_bf16) {
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at + col * 2), "r"(PackBf16(v0, v1)));
      } else {
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at + col * 4), "f"(v0), "f"(v1));
      }
    });
  }

  // The rows' natural-log LSEs, from the slot-0 warps.
  __device__ void StoreLse(const gpu::AttentionTile& t, const float total[2]) const {
    if (slot != 0 || (lane & 3) != 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (row[h] >= t.rows) continue;
      reinterpret_cast<float*>(t.lse)[row[h] * t.lse_stride] =
          total[h] > 0.f ? (m[h] + log2f(total[h])) * kLn2 : -INFINITY;
    }
  }

 private:
  // emit(h, column, v0, v1) for each pair of normalised outputs of the thread's rows within
  // the tile (Store's layout of `value`).
  template <int kBlocks, class Value, class Emit>
  __device__ void ForEachPair(const gpu::AttentionTile& t, const float total[2], int col0,
                              Value value, Emit emit) const {
    const int c2 = (lane % 4) * 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (row[h] >= t.rows) continue;
      const float inv = total[h] > 0.f ? 1.f / total[h] : 0.f;
#pragma unroll
      for (int i = 0; i < kBlocks; ++i) {
        emit(h, col0 + i * 8 + c2, value(i, h, 0) * inv, value(i, h, 1) * inv);
      }
    }
  }
};

}  // namespace mlaserve::cuda

#endif  // MLASERVE_KERNELS_CUDA_TILE_ROWS_CUH_
