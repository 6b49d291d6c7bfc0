// The latent-cache attention tile on Hopper's warpgroup MMA (sm_90a), the bf16 cache's kernel
// there: a thread block of two warpgroups per AttentionTile (up to 64 query rows), online
// softmax over blocks of 64 keys.
//
//   scores   each warpgroup multiplies all 64 query rows by its 32 keys of the block
//            (wgmma m64n32k16 x 36: Q and K read from shared memory by the tensor cores);
//   softmax  row maxima exchanged through shared memory, probabilities written there as the
//            next product's A operand (bf16);
//   values   each warpgroup accumulates its 256 of the 512 output columns over the block's
//            keys (wgmma m64n256k16 x 4), reading V as the same shared-memory tile as K, in
//            its transposed (MN-major) form.
//
// Shared memory holds every operand as tiles of 64 bf16 a 128-byte row with the 128-byte
// swizzle the tensor cores read (wgmma.cuh): Q and each key block as 9 such tiles of 64 rows.
// Keys come in by cp.async, one block ahead. Same contract and numerics as the mma.sync
// kernel (attention_kernel.cu): FlashAttention-2 rescaling in registers, natural-log LSE.

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/latent_tiles.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/paged_rows.cuh"
#include "kernels/cuda/tile_rows.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace mlaserve::cuda {
namespace {

using gpu::AttentionTile;
using latent::kChunks;
using latent::kDk;
using latent::kMatrixBytes;
using latent::kTileBytes;
using latent::LoadQueries;
using latent::TileUnit;

constexpr int kRows = gpu::kAttentionTileRows;  // 64
constexpr int kKeys = 64;                       // a block
constexpr int kThreads = 256;                   // two warpgroups
constexpr int kDv = 512;
constexpr int kQOffset = 0;
constexpr int kStageOffset = kMatrixBytes;
constexpr int kPOffset = kStageOffset + 2 * kMatrixBytes;
constexpr int kRedOffset = kPOffset + kTileBytes;  // float [2][kRows]
constexpr int kVisibleOffset = kRedOffset + 2 * kRows * 4;
constexpr int kTableOffset = kVisibleOffset + kRows * 4;  // int32 [kSharedTablePages]
constexpr int kSharedUsed = kTableOffset + kSharedTablePages * 4;
// The swizzle's atoms need 1,024-byte alignment; the dynamic base is rounded up to it.
constexpr int kSharedBytes = kSharedUsed + 1024;
static_assert(kSharedBytes <= 227 * 1024, "more shared memory than a Hopper SM has");

__device__ __forceinline__ const char* Bytes(gpu::DevicePtr p) {
  return reinterpret_cast<const char*>(p);
}

// Keys [block * kKeys, +kKeys) of the bf16 paged cache; rows past the tile's keys are zeros.
// A warp's rows are 8 apart: their page and row in it follow from the first one's by
// adding, with no division per row.
__device__ void LoadKeys(const AttentionTile& t, const int32_t* table, int block, uint32_t k) {
  constexpr int kWarps = kThreads / 32;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int first = t.first_token + block * kKeys + warp;
  int index = first / t.page_size;
  int in_page = first - index * t.page_size;
#pragma unroll 1
  for (int r = warp; r < kKeys; r += kWarps) {
    const int token = block * kKeys + r;
    const bool valid = token < t.keys;
    const char* row = Bytes(t.base);
    if (valid) {
      const int page = index < kSharedTablePages ? table[index]
                                                 : reinterpret_cast<const int32_t*>(t.pages)[index];
      row +=
          static_cast<int64_t>(page) * t.page_stride + static_cast<int64_t>(in_page) * t.row_stride;
    }
    const uint32_t dst = k + static_cast<uint32_t>(r * 128);
    const int swizzle = r & 7;
#pragma unroll
    for (int i = 0; i < (kChunks * 8 + 31) / 32; ++i) {
      const int unit = lane + i * 32;
      if (unit < kChunks * 8) {
        const uint32_t at =
            dst + static_cast<uint32_t>((unit >> 3) * kTileBytes + (((unit & 7) ^ swizzle) << 4));
        CopyAsync16(at, row + unit * 16, valid);
      }
    }
    in_page += kWarps;
    while (in_page >= t.page_size) {
      in_page -= t.page_size;
      ++index;
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    AttentionWgmmaKernel(const AttentionTile* __restrict__ tiles, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char raw_smem[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(raw_smem) + 1023) & ~static_cast<uintptr_t>(1023));
  const AttentionTile t = tiles[blockIdx.x];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = warp / 4;  // keys [32 group, +32) of a block; columns [256 group, +256)
  const int row0 = (warp % 4) * 16 + lane / 4;
  const int row1 = row0 + 8;
  const int c2 = (lane % 4) * 2;

  const uint32_t q_smem = SharedAddress(smem + kQOffset);
  const uint32_t p_smem = SharedAddress(smem + kPOffset);
  float* red = reinterpret_cast<float*>(smem + kRedOffset);
  int* visible = reinterpret_cast<int*>(smem + kVisibleOffset);
  int32_t* table = reinterpret_cast<int32_t*>(smem + kTableOffset);
  const auto stage = [&](int s) { return SharedAddress(smem + kStageOffset + s * kMatrixBytes); };

  if (threadIdx.x < kRows) {
    visible[threadIdx.x] =
        threadIdx.x < t.rows ? reinterpret_cast<const int32_t*>(t.visible)[threadIdx.x] : 0;
  }
  StagePageTable(t, table, kThreads);
  const int blocks = (t.keys + kKeys - 1) / kKeys;
  LoadQueries(t, q_smem, kThreads);
  __syncthreads();  // the block table
  if (blocks > 0) LoadKeys(t, table, 0, stage(0));
  CopyAsyncCommit();

  float o[kDv / 2 / 2];  // 64 rows x 256 columns over 128 threads
#pragma unroll
  for (int i = 0; i < kDv / 4; ++i) o[i] = 0.f;
  TileRows<2> rows(row0, group, lane);

  for (int b = 0; b < blocks; ++b) {
    CopyAsyncWait<0>();
    FenceSharedForAsyncProxy();
    __syncthreads();  // block b (and Q) landed and visible to the tensor cores; b - 1 done with
    const uint32_t k_smem = stage(b % 2);

    // Scores: 64 rows x this group's 32 keys, on the tensor cores while this thread issues the
    // next block's loads.
    float s[16];
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      const uint32_t offset = (kk >> 2) * kTileBytes + (kk & 3) * 32;
      const uint64_t a = SharedDescriptor(q_smem + offset, 16, 1024);
      const uint64_t bk = SharedDescriptor(k_smem + offset + group * 32 * 128, 16, 1024);
      WgmmaM64N32(s, a, bk, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    if (b + 1 < blocks) LoadKeys(t, table, b + 1, stage((b + 1) % 2));
    CopyAsyncCommit();
    WgmmaWait<0>();
    Settle(s);

    float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = group * 32 + i * 8 + c2 + (j & 1);
        const int row = j < 2 ? row0 : row1;
        float v = s[i * 4 + j] * scale_log2;
        if (b * kKeys + key >= visible[row]) v = -INFINITY;
        s[i * 4 + j] = v;
        block_max[j >> 1] = fmaxf(block_max[j >> 1], v);
      }
    }
    float base[2], alpha[2];
    rows.Advance(block_max[0], block_max[1], red, base, alpha);
    float row_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float p[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        p[j] = exp2f(s[i * 4 + j] - base[j >> 1]);
        row_sum[j >> 1] += p[j];
      }
      const int key = group * 32 + i * 8 + c2;
      const uint32_t at0 = TileUnit(p_smem, row0, key >> 3) + (key & 7) * 2;
      const uint32_t at1 = TileUnit(p_smem, row1, key >> 3) + (key & 7) * 2;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at0), "r"(PackBf16(p[0], p[1])));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at1), "r"(PackBf16(p[2], p[3])));
    }
    rows.Accumulate(row_sum[0], row_sum[1], alpha);
    // Once a row's maximum settles (most blocks after the first few), alpha is exactly 1:
    // a warp whose rows all kept theirs skips the 128 multiplies.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < kDv / 16; ++i) {
        o[i * 4 + 0] *= alpha[0];
        o[i * 4 + 1] *= alpha[0];
        o[i * 4 + 2] *= alpha[1];
        o[i * 4 + 3] *= alpha[1];
      }
    }
    FenceSharedForAsyncProxy();
    __syncthreads();  // the block's probabilities are in shared memory for both groups

    // Values: this group's 256 columns over the block's 64 keys; V is K's first 512 columns.
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint64_t a = SharedDescriptor(p_smem + kk * 32, 16, 1024);
      const uint64_t v =
          SharedDescriptor(k_smem + group * 4 * kTileBytes + kk * 16 * 128, kTileBytes, 1024);
      WgmmaM64N256Tb(o, a, v, 1);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    Settle(o);
  }

  float total[2];
  rows.Totals(red, total);
  rows.Store<kDv / 16>(t, total, group * (kDv / 2),
                       [&](int i, int h, int e) { return o[i * 4 + h * 2 + e]; });
#else
  (void)tiles;
  (void)scale_log2;
  __trap();  // built without sm_90a: EnqueueAttention never picks this kernel there
#endif
}

}  // namespace

bool WgmmaAttentionRuns(int compute_major, int compute_minor) {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, AttentionWgmmaKernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // sm_90a machine code (not an sm_80 build of the trapping stub) on a 9.0 device.
  return compute_major == 9 && compute_minor == 0 && attributes.binaryVersion == 90;
}

cudaError_t PrepareWgmmaAttentionKernel() {
  return cudaFuncSetAttribute(AttentionWgmmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSharedBytes);
}

cudaError_t EnqueueWgmmaAttention(const gpu::Launch& launch, cudaStream_t stream) {
  constexpr float kLog2e = 1.4426950408889634f;
  AttentionWgmmaKernel<<<launch.count, kThreads, kSharedBytes, stream>>>(
      reinterpret_cast<const AttentionTile*>(launch.tiles), launch.softmax_scale * kLog2e);
  return cudaGetLastError();
}

}  // namespace mlaserve::cuda
