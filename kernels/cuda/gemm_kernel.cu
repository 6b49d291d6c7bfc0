// The projection steps (absorb_q, project_out) and the expansions' matrix products as one
// grouped GEMM launch: each thread block computes one 64 x 64 tile of one job's C (GemmTile),
// with bf16 tensor-core MMAs and fp32 accumulation over depth slices of 32, two slices in
// flight by cp.async. Jobs whose rows, strides or depth are not 16-byte multiples take a
// scalar load path; the shapes of the models served take the vector one.

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/mma_primitives.cuh"

namespace mlaserve::cuda {
namespace {

using gpu::GemmJob;
using gpu::GemmTile;

constexpr int kTileM = gpu::kGemmTileRows;
constexpr int kTileN = gpu::kGemmTileCols;
constexpr int kTileK = 32;
constexpr int kThreads = 128;
// Rows padded by 16 bytes so the 8 rows an ldmatrix reads sit in distinct bank groups.
constexpr int kRowK = kTileK + 8;  // A, and B stored [n][k]
constexpr int kRowN = kTileN + 8;  // B stored [k][n]

struct Slice {
  __nv_bfloat16 a[kTileM * kRowK];
  __nv_bfloat16 b[kTileN * kRowK > kTileK* kRowN ? kTileN* kRowK : kTileK* kRowN];
};

__device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// 8 consecutive elements of a row at `src` (those at index >= `count` read as zero).
__device__ __forceinline__ void LoadEight(__nv_bfloat16* dst, const __nv_bfloat16* src, int count,
                                          bool vector) {
  if (vector) {
    CopyAsync16(SharedAddress(dst), src, count > 0);
    return;
  }
  for (int i = 0; i < 8; ++i) dst[i] = i < count ? src[i] : __float2bfloat16_rn(0.f);
}

__device__ void LoadSlice(const GemmJob& j, int row0, int col0, int k0, bool vector, Slice& s) {
  const auto* a = reinterpret_cast<const __nv_bfloat16*>(j.a);
  const auto* b = reinterpret_cast<const __nv_bfloat16*>(j.b);
  for (int i = threadIdx.x; i < kTileM * (kTileK / 8); i += kThreads) {
    const int r = i / (kTileK / 8);
    const int c = (i % (kTileK / 8)) * 8;
    const int count = (row0 + r < j.rows) ? min(8, j.k - (k0 + c)) : 0;
    LoadEight(&s.a[r * kRowK + c], a + (static_cast<int64_t>(row0 + r) * j.lda + k0 + c), count,
              vector);
  }
  if (j.transpose_b) {  // B [n][k]
    for (int i = threadIdx.x; i < kTileN * (kTileK / 8); i += kThreads) {
      const int n = i / (kTileK / 8);
      const int c = (i % (kTileK / 8)) * 8;
      const int count = (col0 + n < j.n) ? min(8, j.k - (k0 + c)) : 0;
      LoadEight(&s.b[n * kRowK + c], b + (static_cast<int64_t>(col0 + n) * j.ldb + k0 + c), count,
                vector);
    }
  } else {  // B [k][n]
    for (int i = threadIdx.x; i < kTileK * (kTileN / 8); i += kThreads) {
      const int k = i / (kTileN / 8);
      const int c = (i % (kTileN / 8)) * 8;
      const int count = (k0 + k < j.k) ? min(8, j.n - (col0 + c)) : 0;
      LoadEight(&s.b[k * kRowN + c], b + (static_cast<int64_t>(k0 + k) * j.ldb + col0 + c), count,
                vector);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    GemmKernel(const GemmTile* __restrict__ tiles, const GemmJob* __restrict__ jobs) {
  __shared__ __align__(128) Slice slices[2];
  const GemmTile tile = tiles[blockIdx.x];
  const GemmJob j = jobs[tile.job];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wm = warp % 2;  // rows [32 wm, +32) of the tile
  const int wn = warp / 2;  // columns [32 wn, +32)
  // A chunk of 8 elements that starts in bounds lies wholly in bounds when depth and the
  // B columns are multiples of 8.
  const bool vector = Aligned16(reinterpret_cast<const void*>(j.a)) &&
                      Aligned16(reinterpret_cast<const void*>(j.b)) && j.lda % 8 == 0 &&
                      j.ldb % 8 == 0 && j.k % 8 == 0 && (j.transpose_b || j.n % 8 == 0);

  float c[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) c[mt][nt][0] = c[mt][nt][1] = c[mt][nt][2] = c[mt][nt][3] = 0.f;

  const int slices_count = (j.k + kTileK - 1) / kTileK;
  LoadSlice(j, tile.row0, tile.col0, 0, vector, slices[0]);
  CopyAsyncCommit();
  for (int s = 0; s < slices_count; ++s) {
    CopyAsyncWait<0>();
    __syncthreads();
    if (s + 1 < slices_count)
      LoadSlice(j, tile.row0, tile.col0, (s + 1) * kTileK, vector, slices[(s + 1) % 2]);
    CopyAsyncCommit();
    const Slice& sl = slices[s % 2];
    const uint32_t a_base = SharedAddress(sl.a);
    const uint32_t b_base = SharedAddress(sl.b);
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = wm * 32 + mt * 16 + (lane & 15);
        LoadMatrixX4(a[mt], a_base + (r * kRowK + ks * 16 + (lane >> 4) * 8) * 2);
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t bb[4];
        if (j.transpose_b) {
          const int n = wn * 32 + np * 16 + ((lane >> 4) << 3) + (lane & 7);
          LoadMatrixX4(bb, b_base + (n * kRowK + ks * 16 + ((lane >> 3) & 1) * 8) * 2);
        } else {
          const int k = ks * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
          LoadMatrixX4Trans(bb, b_base + (k * kRowN + wn * 32 + np * 16 + (lane >> 4) * 8) * 2);
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          MmaBf16(c[mt][np * 2], a[mt], bb[0], bb[1]);
          MmaBf16(c[mt][np * 2 + 1], a[mt], bb[2], bb[3]);
        }
      }
    }
  }

  const int g = lane / 4;
  const int c2 = (lane % 4) * 2;
  const float* row_scale = reinterpret_cast<const float*>(j.row_scale);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = tile.row0 + wm * 32 + mt * 16 + g + h * 8;
      if (row >= j.rows) continue;
      const float scale = row_scale != nullptr ? row_scale[row] : 1.f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = tile.col0 + wn * 32 + nt * 8 + c2;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (col + e >= j.n) continue;
          const float v = c[mt][nt][h * 2 + e] * scale;
          const int64_t at = static_cast<int64_t>(row) * j.ldc + col + e;
          if (j.c_bf16) {
            reinterpret_cast<__nv_bfloat16*>(j.c)[at] = __float2bfloat16_rn(v);
          } else {
            reinterpret_cast<float*>(j.c)[at] = v;
          }
        }
      }
    }
  }
}

}  // namespace

cudaError_t EnqueueGemm(const gpu::Launch& launch, cudaStream_t stream) {
  GemmKernel<<<launch.count, kThreads, 0, stream>>>(
      reinterpret_cast<const GemmTile*>(launch.tiles),
      reinterpret_cast<const GemmJob*>(launch.records));
  return cudaGetLastError();
}

}  // namespace mlaserve::cuda
