// The latent-cache attention tile on Hopper when its keys are whole 64-row blocks of one bf16
// pool (Launch::key_pool_rows > 0): FlashMLA's schedule for the dense decode (its "seesaw",
// deepseek-ai/FlashMLA csrc/sm90/decode/dense), written against our own primitives.
//
// A thread block of two warpgroups per AttentionTile (up to 64 query rows). Keys come in
// blocks of 64 by the bulk tensor copy, one 64 x 64 tile (128 bytes a row, 128-byte swizzle)
// at a time, each completing an mbarrier, into two buffers: even blocks into K0, odd into K1.
// The output's 512 columns are split between the groups (group g holds columns [256 g, +256)
// in registers). Per pair of blocks (b, b + 1):
//
//   group 0                                  group 1
//   softmax of S(b) -> P(b), scale0  ----->  softmax of S(b + 1) (max after b) -> P(b + 1)
//   O0 += P(b) . V0[:, 0:256] (P in regs)    O1 rescaled by both; P(b + 1) to shared memory
//                                    <-----  scale1;  O1 += P(b + 1) . V1[:, 256:512]
//   P(b) x scale1 to shared memory   ----->  O1 += P(b) . V0[:, 256:512]
//   O0 x scale1 += P(b + 1) . V1[:, 0:256]   fetch blocks b + 2 (right half), b + 3 (right)
//   fetch b + 2 (left), S(b + 2) = Q K0^T    S(b + 3) = Q K1^T
//   fetch b + 3 (left)
//
// so each group's score GEMM (m64n64, operands balanced against shared memory's bandwidth)
// overlaps the other's softmax and value GEMMs, and a buffer's half is fetched again as soon
// as both its readers are done with it. Shared memory: Q (9 tiles; the last, the rope columns,
// is moved into registers so that P(b + 1) can take its place), K0, K1 (9 tiles each), P(b)
// and the per-row running max and scale factors: 226 KiB. After the last block the two key
// buffers take the normalised output rows, which the copy engine writes a row at a time.
//
// Same contract and numerics as the other attention kernels (attention_kernel.cu): scores in
// base 2, FlashAttention-2 rescaling, natural-log LSE, a row that sees no key gets zeros and
// -inf. Keys past the tile's last are zeroed as values before use (pool rows past a sequence's
// end hold anything, NaN included).

#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/latent_tiles.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/score_fragments.cuh"
#include "kernels/cuda/tile_rows.cuh"
#include "kernels/cuda/tma.cuh"
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
using fragments::Exponentiate;
using fragments::kMaxInit;
using fragments::MaskAndMax;
using fragments::PackProbabilities;
using fragments::Rescale;
using fragments::SettleRegisters;

constexpr int kRows = gpu::kAttentionTileRows;  // 64
constexpr int kKeys = gpu::kAttentionBlockKeys;  // 64
constexpr int kThreads = 256;

constexpr int kQOffset = 0;
constexpr int kP1Offset = kQOffset + (kChunks - 1) * kTileBytes;  // Q's last tile, once in regs
constexpr int kK0Offset = kMatrixBytes;
constexpr int kK1Offset = 2 * kMatrixBytes;
constexpr int kP0Offset = 3 * kMatrixBytes;
constexpr int kMaxOffset = kP0Offset + kTileBytes;  // float [kRows], base 2
constexpr int kScale0Offset = kMaxOffset + kRows * 4;
constexpr int kScale1Offset = kScale0Offset + kRows * 4;
constexpr int kSumOffset = kScale1Offset + kRows * 4;  // float [2][kRows]
constexpr int kBarrierOffset = kSumOffset + 2 * kRows * 4;  // uint64 [2][kChunks]
constexpr int kSharedUsed = kBarrierOffset + 2 * kChunks * 8;
constexpr int kSharedBytes = kSharedUsed + 1024;  // the base rounded up to the swizzle's atom
static_assert(kSharedBytes <= 227 * 1024, "more shared memory than a Hopper SM has");
constexpr int kDv = 512;
static_assert(kRows * StagedRowBytes(kDv, false) <= 2 * kMatrixBytes,
              "the staged output must fit in the two key buffers");

// Named barriers between the groups (0 is __syncthreads); 5 + g: within group g.
enum Barrier : int { kScale0Ready = 1, kScale1Ready = 2, kP0Ready = 3, kP1Ready = 4 };

// The pool row of key block `block`'s first key (a block lies within one page).
__device__ __forceinline__ int BlockRow(const AttentionTile& t, int block) {
  const int position = t.first_token + block * kKeys;
  const int index = position / t.page_size;
  const int page = __ldg(reinterpret_cast<const int32_t*>(t.pages) + index);
  return page * t.page_size + (position - index * t.page_size);
}

// Tiles [first, last) of the block at pool row `row` into `buffer`, each on its barrier, to
// be evicted from L2 first (a block's second reader, the request's other tile, runs beside
// the first).
__device__ __forceinline__ void FetchKeys(const CUtensorMap* map, int row, uint32_t buffer,
                                          uint32_t barriers, int first, int last) {
  const uint64_t policy = EvictFirstPolicy();
  for (int c = first; c < last; ++c) {
    MbarrierExpectBytes(barriers + c * 8, kTileBytes);
    TmaLoad2d(buffer + c * kTileBytes, map, c * 64, row, barriers + c * 8, policy);
  }
}

// s (+)= Q . K^T over tiles [kFirst, kLast) of the block in `k` (4 k16 steps a tile; s
// starts afresh at the first when kFresh), each tile's product issued once its keys have
// landed; the last tile's Q comes from registers.
template <int kFirst, int kLast, bool kFresh>
__device__ __forceinline__ void Scores(float (&s)[32], uint32_t q, uint32_t k, uint32_t barriers,
                                       int parity, const uint32_t (&q_rope)[4][4]) {
#pragma unroll
  for (int c = kFirst; c < kLast; ++c) {
    MbarrierWait(barriers + c * 8, parity);
    WgmmaFence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t offset = c * kTileBytes + j * 32;
      const uint64_t b = SharedDescriptor(k + offset, 16, 1024);
      const int accumulate = kFresh && c == kFirst && j == 0 ? 0 : 1;
      if (c == kChunks - 1) {
        WgmmaM64N64Rs(s, q_rope[j], b, accumulate);
      } else {
        WgmmaM64N64(s, SharedDescriptor(q + offset, 16, 1024), b, accumulate);
      }
    }
    WgmmaCommit();
  }
}

// o (+)= P . V for this group's 256 value columns of the block in `k`, P from registers...
__device__ __forceinline__ void ValuesLocal(float (&o)[128], const uint32_t (&p)[4][4],
                                            uint32_t k, int group) {
  WgmmaFence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    WgmmaM64N256RsTb(
        o, p[j], SharedDescriptor(k + group * 4 * kTileBytes + j * 16 * 128, kTileBytes, 1024), 1);
  }
  WgmmaCommit();
}
// ... or from shared memory (the other group's).
__device__ __forceinline__ void ValuesShared(float (&o)[128], uint32_t p, uint32_t k, int group) {
  WgmmaFence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    WgmmaM64N256Tb(
        o, SharedDescriptor(p + j * 32, 16, 1024),
        SharedDescriptor(k + group * 4 * kTileBytes + j * 16 * 128, kTileBytes, 1024), 1);
  }
  WgmmaCommit();
}

// Value rows [valid, kKeys) of this group's half of the block in `k` set to zero, visible to
// the group's tensor cores.
__device__ void ZeroValueRows(uint32_t k, int group, int valid, int in_group) {
  const int units = (kKeys - valid) * 4 * 8;  // 16-byte units: rows x 4 tiles x 8
  for (int i = in_group; i < units; i += 128) {
    const int row = valid + i / 32;
    const int tile = group * 4 + (i / 8) % 4;
    const uint32_t at = k + static_cast<uint32_t>(tile * kTileBytes + row * 128 + (i % 8) * 16);
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0) : "memory");
  }
  FenceSharedForAsyncProxy();
  NamedBarrierSync(5 + group, 128);
}

// factor[h] x the probabilities, in bf16 into the 64 x 64 tile at p (the value product's A).
__device__ __forceinline__ void StoreProbabilities(uint32_t p, const float (&s)[32],
                                                   const float (&factor)[2], int row, int c2) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int key = i * 8 + c2;
    const uint32_t at0 = TileUnit(p, row, key >> 3) + (key & 7) * 2;
    const uint32_t at1 = TileUnit(p, row + 8, key >> 3) + (key & 7) * 2;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at0),
                 "r"(PackBf16(s[4 * i] * factor[0], s[4 * i + 1] * factor[0])));
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at1),
                 "r"(PackBf16(s[4 * i + 2] * factor[1], s[4 * i + 3] * factor[1])));
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    AttentionSeesawKernel(const AttentionTile* __restrict__ tiles, float scale_log2,
                          const __grid_constant__ CUtensorMap keys) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char raw_smem[];
  // Offset from the array itself, not rebuilt from an integer, so that the compiler knows
  // the per-row maxima and scales below are in shared memory (LDS/STS, not generic accesses).
  unsigned char* smem = raw_smem + ((1024 - (SharedAddress(raw_smem) & 1023)) & 1023);
  const AttentionTile t = tiles[blockIdx.x];
  const int group = threadIdx.x / 128;
  const int in_group = threadIdx.x % 128;
  const int lane = threadIdx.x % 32;
  const int row = (in_group / 32) * 16 + lane / 4;  // and row + 8
  const int c2 = (lane % 4) * 2;

  const uint32_t q = SharedAddress(smem + kQOffset);
  const uint32_t k0 = SharedAddress(smem + kK0Offset);
  const uint32_t k1 = SharedAddress(smem + kK1Offset);
  const uint32_t p0 = SharedAddress(smem + kP0Offset);
  const uint32_t p1 = SharedAddress(smem + kP1Offset);
  const uint32_t barriers0 = SharedAddress(smem + kBarrierOffset);
  const uint32_t barriers1 = barriers0 + kChunks * 8;
  float* max_of = reinterpret_cast<float*>(smem + kMaxOffset);
  float* scale0_of = reinterpret_cast<float*>(smem + kScale0Offset);
  float* scale1_of = reinterpret_cast<float*>(smem + kScale1Offset);
  float* sum_of = reinterpret_cast<float*>(smem + kSumOffset);
  const CUtensorMap* map = &keys;
  const int blocks = (t.keys + kKeys - 1) / kKeys;
  const int partial = t.keys % kKeys;  // keys in the last block when it is not full

  if (threadIdx.x == 0) {
    // The first two blocks are fetched before the block-wide barrier: only this thread has
    // to see the barriers initialised for that, and the others wait on them after it.
    PrefetchTensorMap(map);
    for (int i = 0; i < 2 * kChunks; ++i) MbarrierInit(barriers0 + i * 8, 1);
    FenceBarrierInit();
    FenceSharedForAsyncProxy();  // the initialised barriers, seen by the copy engine too
    if (blocks > 0) FetchKeys(map, BlockRow(t, 0), k0, barriers0, 0, kChunks);
    if (blocks > 1) FetchKeys(map, BlockRow(t, 1), k1, barriers1, 0, kChunks);
  }
  if (threadIdx.x < kRows) max_of[threadIdx.x] = kMaxInit;
  __syncthreads();
  LoadQueries(t, q, kThreads);
  CopyAsyncCommit();
  CopyAsyncWait<0>();
  FenceSharedForAsyncProxy();
  __syncthreads();
  uint32_t q_rope[4][4];  // Q's last tile as A fragments (k16 steps j)
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    LoadMatrixX4(q_rope[j], TileUnit(q, (in_group / 32) * 16 + lane % 16,
                                     (kChunks - 1) * 8 + 2 * j + lane / 16));
  }
  __syncthreads();  // every thread holds its rope fragments: the tile may become P(b + 1)

  int visible[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row + 8 * h;
    // Rows past the tile's: answers discarded; no masking on their account.
    visible[h] = r < t.rows ? reinterpret_cast<const int32_t*>(t.visible)[r] : t.keys;
  }
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float l[2] = {0.f, 0.f};
  float s[32];
  int parity = 0;  // of this group's buffer's barriers

  const uint32_t own_k = group == 0 ? k0 : k1;
  const uint32_t own_barriers = group == 0 ? barriers0 : barriers1;
  if (blocks > group) {
    Scores<0, kChunks, true>(s, q, own_k, own_barriers, parity, q_rope);
    parity ^= 1;
  }
  WgmmaWait<0>();
  Settle(s);

#pragma unroll 1
  for (int b = 0; b < blocks; b += 2) {
    const bool has1 = b + 1 < blocks;  // the pair's second block
    const bool next0 = b + 2 < blocks;
    const bool next1 = b + 3 < blocks;
    // The next pair's pool rows, looked up before the barriers whose release they would delay.
    const int row2 = next0 ? BlockRow(t, b + 2) : 0;
    const int row3 = next1 ? BlockRow(t, b + 3) : 0;
    uint32_t p[4][4] = {};
    if (group == 0) {
      float block_max[2], base[2], scale[2], sum[2];
      MaskAndMax(s, scale_log2, b, visible, c2, block_max);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float old = max_of[row + 8 * h];
        base[h] = fmaxf(old, block_max[h]);
        scale[h] = exp2f(old - base[h]);
      }
      __syncwarp();  // the quad has read the old maxima
      if (lane % 4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          max_of[row + 8 * h] = base[h];
          scale0_of[row + 8 * h] = scale[h];
        }
      }
      Exponentiate(s, scale_log2, base, sum);
      Rescale(o, scale);
      l[0] = l[0] * scale[0] + sum[0];
      l[1] = l[1] * scale[1] + sum[1];
      PackProbabilities(s, p);
      NamedBarrierArrive(kScale0Ready, kThreads);

      if (!has1 && partial != 0) ZeroValueRows(k0, 0, partial, in_group);
      ValuesLocal(o, p, k0, 0);
      WgmmaWait<0>();
      Settle(o);
      SettleRegisters(p);

      NamedBarrierSync(kScale1Ready, kThreads);
      if (next0 && in_group == 0) FetchKeys(map, row2, k0, barriers0, 0, 4);
      const float scale1[2] = {scale1_of[row], scale1_of[row + 8]};
      StoreProbabilities(p0, s, scale1, row, c2);
      FenceSharedForAsyncProxy();
      NamedBarrierArrive(kP0Ready, kThreads);

      if (has1) {
        if (!next0 && partial != 0) ZeroValueRows(k1, 0, partial, in_group);
        NamedBarrierSync(kP1Ready, kThreads);
        Rescale(o, scale1);
        l[0] *= scale1[0];
        l[1] *= scale1[1];
        ValuesShared(o, p1, k1, 0);
      }
      if (next0) Scores<0, 4, true>(s, q, k0, barriers0, parity, q_rope);
      if (next1) {
        WgmmaWait<4>();  // the value product over K1's left half
        if (in_group == 0) FetchKeys(map, row3, k1, barriers1, 0, 4);
      }
      if (next0) {
        Scores<4, kChunks, false>(s, q, k0, barriers0, parity, q_rope);
        parity ^= 1;
      }
      WgmmaWait<0>();
      Settle(o);
      Settle(s);
    } else {
      NamedBarrierSync(kScale0Ready, kThreads);
      float scale[2] = {1.f, 1.f}, sum[2] = {0.f, 0.f};
      if (has1) {
        float block_max[2], base[2];
        MaskAndMax(s, scale_log2, b + 1, visible, c2, block_max);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float old = max_of[row + 8 * h];
          base[h] = fmaxf(old, block_max[h]);
          scale[h] = exp2f(old - base[h]);
        }
        __syncwarp();
        if (lane % 4 == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) max_of[row + 8 * h] = base[h];
        }
        Exponentiate(s, scale_log2, base, sum);
        PackProbabilities(s, p);
      }
      if (lane % 4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) scale1_of[row + 8 * h] = scale[h];
      }
      // O1 follows both maxima: block b's (scale0) and this block's.
      const float factor[2] = {scale[0] * scale0_of[row], scale[1] * scale0_of[row + 8]};
      Rescale(o, factor);
      l[0] = l[0] * factor[0] + sum[0];
      l[1] = l[1] * factor[1] + sum[1];
      NamedBarrierArrive(kScale1Ready, kThreads);

      if (has1) {
        const float one[2] = {1.f, 1.f};
        StoreProbabilities(p1, s, one, row, c2);
        if (!next0 && partial != 0) ZeroValueRows(k1, 1, partial, in_group);
        ValuesLocal(o, p, k1, 1);
        FenceSharedForAsyncProxy();  // P(b + 1) for group 0's tensor cores
      }
      NamedBarrierSync(kP0Ready, kThreads);
      if (!has1 && partial != 0) ZeroValueRows(k0, 1, partial, in_group);
      ValuesShared(o, p0, k0, 1);
      if (has1) NamedBarrierArrive(kP1Ready, kThreads);
      if (next1) {
        WgmmaWait<1>();  // the product over K1's right half
        if (in_group == 0) FetchKeys(map, row3, k1, barriers1, 4, kChunks);
      }
      if (next0) {
        WgmmaWait<0>();  // and over K0's
        if (in_group == 0) FetchKeys(map, row2, k0, barriers0, 4, kChunks);
      }
      if (next1) {
        // The right half first: fetched above, before group 0 could refetch the left.
        Scores<4, kChunks, true>(s, q, k1, barriers1, parity, q_rope);
        Scores<0, 4, false>(s, q, k1, barriers1, parity, q_rope);
        parity ^= 1;
      }
      WgmmaWait<0>();
      Settle(o);
      Settle(s);
      SettleRegisters(p);
    }
  }

  // Each group summed the probabilities of its own blocks: the row totals are both.
  const float l0 = QuadSum(l[0]);
  const float l1 = QuadSum(l[1]);
  if (lane % 4 == 0) {
    sum_of[group * kRows + row] = l0;
    sum_of[group * kRows + row + 8] = l1;
  }
  __syncthreads();
  const float total[2] = {sum_of[row] + sum_of[kRows + row],
                          sum_of[row + 8] + sum_of[kRows + row + 8]};
  TileRows<2> rows(row, group, lane);
  rows.m[0] = max_of[row];
  rows.m[1] = max_of[row + 8];
  const auto value = [&](int i, int h, int e) { return o[i * 4 + h * 2 + e]; };
  const int64_t row_bytes = t.out_stride * (t.out_bf16 ? 2 : 4);
  if (t.out % 16 != 0 || row_bytes % 16 != 0) {
    rows.Store<32>(t, total, group * 256, value);
    return;
  }
  // Staged in the key buffers (free: every block fetched has been consumed) and written a
  // row per bulk copy: element-wise stores from the fragments cost a quarter of a short tile.
  const int stride = StagedRowBytes(kDv, t.out_bf16 != 0);
  rows.Stage<32>(t, total, group * 256, value, k0, stride);
  FenceSharedForAsyncProxy();
  __syncthreads();
  if (threadIdx.x < t.rows) {
    BulkStore(reinterpret_cast<char*>(t.out) + threadIdx.x * row_bytes, k0 + threadIdx.x * stride,
              kDv * (t.out_bf16 ? 2 : 4));
    BulkStoreWait();
  }
  rows.StoreLse(t, total);
#else
  (void)tiles;
  (void)scale_log2;
  (void)keys;
  __trap();  // built without sm_90a: the runtime never picks this kernel there
#endif
}

}  // namespace

cudaError_t PrepareSeesawAttentionKernel(void** encode_tensor_map) {
  cudaDriverEntryPointQueryResult found{};
  if (cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", encode_tensor_map,
                                                       12000, cudaEnableDefault, &found);
      e != cudaSuccess) {
    return e;
  }
  if (found != cudaDriverEntryPointSuccess || *encode_tensor_map == nullptr) {
    return cudaErrorNotSupported;
  }
  return cudaFuncSetAttribute(AttentionSeesawKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSharedBytes);
}

cudaError_t EnqueueSeesawAttention(const gpu::Launch& launch, void* encode_tensor_map,
                                   cudaStream_t stream) {
  if (launch.key_pool_rows <= 0 || launch.key_row_stride % 16 != 0) return cudaErrorNotSupported;
  // The pool as a matrix of key rows; a box is one 64-column tile of a block's 64 rows.
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kDk),
                              static_cast<cuuint64_t>(launch.key_pool_rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(launch.key_row_stride)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(kKeys)};
  const cuuint32_t element_strides[2] = {1, 1};
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(encode_tensor_map);
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                            reinterpret_cast<void*>(static_cast<uintptr_t>(launch.key_pool)),
                            dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  constexpr float kLog2e = 1.4426950408889634f;
  AttentionSeesawKernel<<<launch.count, kThreads, kSharedBytes, stream>>>(
      reinterpret_cast<const AttentionTile*>(launch.tiles), launch.softmax_scale * kLog2e, map);
  return cudaGetLastError();
}

}  // namespace mlaserve::cuda
