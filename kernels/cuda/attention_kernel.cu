// The attention step on Hopper-class GPUs: one thread block per AttentionTile (up to 64 query
// rows of one row group), online softmax over blocks of 64 keys, bf16 tensor-core MMAs with
// fp32 accumulation (kernels/gpu/gpu_jobs.h has the tile's contract).
//
// Eight warps split the work as a 4 x 2 grid: warp (r, c) computes the scores of query rows
// [16 r, 16 r + 16) against keys [32 c, 32 c + 32) of the block, and afterwards the output
// columns [c dv/2, (c + 1) dv/2) of the same rows over all 64 keys. The two warps of a row
// exchange their row maxima and their probabilities through shared memory, so each score is
// computed once. Keys come in by cp.async, two blocks in flight (the FP8 cache: its raw bytes
// one block ahead, widened to bf16 in shared memory; e4m3 widens exactly).
//
// Softmax runs in base 2 on scores pre-multiplied by scale * log2(e); the LSE is returned in
// natural log. The rescaling is FlashAttention-2's (the running output multiplied by
// exp(m_old - m_new) in registers): the AMLA integer-add keeps an output in global memory,
// where a GPU keeps it in registers; answers are held to the fp64 golden at FlashMLA's
// tolerances, not bit for bit to the host's AMLA arithmetic.

#include <cuda_fp8.h>

#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/paged_rows.cuh"
#include "kernels/cuda/tile_rows.cuh"

namespace mlaserve::cuda {
namespace {

using gpu::AttentionTile;
using gpu::KeysKind;

constexpr int kRows = gpu::kAttentionTileRows;
constexpr int kKeys = 64;  // keys per block

template <int kDk, int kDv, KeysKind kKind, int kColumnWarps>
struct Shape {
  // 4 x kColumnWarps warps: warp (r, c) owns query rows [16 r, +16), keys [c kWarpKeys, +)
  // of each block for the scores, output columns [c kWarpCols, +) for the values.
  static constexpr int kThreads = 4 * kColumnWarps * 32;
  static constexpr int kWarpKeys = kKeys / kColumnWarps;
  static constexpr int kScoreTiles = kWarpKeys / 8;  // n-tiles of the scores per warp
  static constexpr int kDvWidth = kDv;
  static constexpr bool kDense = kKind == KeysKind::kDense;
  static constexpr bool kFp8 = kKind == KeysKind::kPagedFp8;
  static constexpr int kDr = kDk - kDv;
  static constexpr int kQChunks = kDk / 8;  // 16-byte chunks of a bf16 row
  static constexpr int kKChunks = kDk / 8;
  // Values: the first dv columns of the keys' rows (the latent cache), or rows of their own.
  static constexpr int kVChunks = kDense ? kDv / 8 : kKChunks;
  static constexpr int kStages = kFp8 ? 1 : 2;
  static constexpr int kKBytes = kKeys * kDk * 2;
  static constexpr int kVBytes = kDense ? kKeys * kDv * 2 : 0;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  // FP8: a block's raw content [kKeys][dv] e4m3, rope [kKeys][dr] bf16, scales [kKeys] fp32.
  static constexpr int kRawContentBytes = kFp8 ? kKeys * kDv : 0;
  static constexpr int kRawRopeBytes = kFp8 ? kKeys * kDr * 2 : 0;

  static constexpr int kQOffset = 0;
  static constexpr int kStageOffset = kQOffset + kRows * kDk * 2;
  static constexpr int kRawOffset = kStageOffset + kStages * kStageBytes;
  static constexpr int kPOffset = kRawOffset + kRawContentBytes + kRawRopeBytes;
  static constexpr int kRedOffset = kPOffset + kRows * kKeys * 2;  // float [warps][kRows]
  static constexpr int kVisibleOffset = kRedOffset + kColumnWarps * kRows * 4;  // int32
  static constexpr int kScaleOffset = kVisibleOffset + kRows * 4;               // float [kKeys]
  static constexpr int kRawScaleOffset = kScaleOffset + kKeys * 4;              // float [kKeys]
  static constexpr int kTableOffset = kRawScaleOffset + kKeys * 4;  // int32 [table pages]
  static constexpr int kSharedBytes = kTableOffset + (kDense ? 0 : kSharedTablePages * 4);

  static_assert(kDk % 64 == 0 && kDv % 64 == 0 && kDv <= kDk, "unsupported widths");
  static_assert(kSharedBytes <= 227 * 1024, "more shared memory than a Hopper SM has");
};

__device__ __forceinline__ const char* Bytes(gpu::DevicePtr p) {
  return reinterpret_cast<const char*>(p);
}

// Rows of the tile's queries, zeros past its last row.
template <class S>
__device__ void LoadQueries(const AttentionTile& t, uint32_t q_smem) {
  for (int i = threadIdx.x; i < kRows * S::kQChunks; i += S::kThreads) {
    const int row = i / S::kQChunks;
    const int chunk = i % S::kQChunks;
    const bool valid = row < t.rows;
    const char* src =
        Bytes(t.q) + (valid ? (static_cast<int64_t>(row) * S::kQChunks + chunk) * 16 : 0);
    CopyAsync16(SwizzledChunk<S::kQChunks>(q_smem, row, chunk), src, valid);
  }
}

// Keys [block * kKeys, +kKeys) into a stage (bf16 caches); rows past the tile's keys become
// zeros, so that no value a row must not see (a NaN in an unused slot) reaches an MMA.
template <class S>
__device__ void LoadKeys(const AttentionTile& t, const int32_t* table, int block, uint32_t k_smem,
                         uint32_t v_smem) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int r = warp; r < kKeys; r += S::kThreads / 32) {
    const int token = block * kKeys + r;
    const bool valid = token < t.keys;
    const char* k_row = Bytes(t.base);
    const char* v_row = Bytes(t.values);
    if (valid) {
      if constexpr (S::kDense) {
        k_row += static_cast<int64_t>(token) * t.ldk * 2;
        v_row += static_cast<int64_t>(token) * t.ldv * 2;
      } else {
        int in_page = 0;
        k_row = PageOf(t, table, token, &in_page) + static_cast<int64_t>(in_page) * t.row_stride;
      }
    }
    for (int c = lane; c < S::kKChunks; c += 32) {
      CopyAsync16(SwizzledChunk<S::kKChunks>(k_smem, r, c), k_row + c * 16, valid);
    }
    if constexpr (S::kDense) {
      for (int c = lane; c < S::kVChunks; c += 32) {
        CopyAsync16(SwizzledChunk<S::kVChunks>(v_smem, r, c), v_row + c * 16, valid);
      }
    }
  }
}

// The FP8 cache's raw bytes of a block (kernels/core/fp8_paged_kv_cache.h: content, scales
// and rope in sections of the page).
template <class S>
__device__ void LoadFp8Raw(const AttentionTile& t, const int32_t* table, int block, char* raw,
                           float* raw_scales) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  constexpr int kContentChunks = S::kDvWidth / 16;
  constexpr int kRopePieces = S::kDr * 2 / 8;  // 8-byte copies: the section may sit at 8 mod 16
  for (int r = warp; r < kKeys; r += S::kThreads / 32) {
    const int token = block * kKeys + r;
    const bool valid = token < t.keys;
    const char* page = Bytes(t.base);
    int row = 0;
    if (valid) page = PageOf(t, table, token, &row);
    const char* content = page + static_cast<int64_t>(row) * S::kDvWidth;
    for (int c = lane; c < kContentChunks; c += 32) {
      CopyAsync16(SharedAddress(raw + r * S::kDvWidth + c * 16), content + c * 16, valid);
    }
    const char* rope = page + t.fp8_rope_offset + static_cast<int64_t>(row) * S::kDr * 2;
    char* rope_smem = raw + S::kRawContentBytes + r * S::kDr * 2;
    for (int c = lane; c < kRopePieces; c += 32) {
      const uint32_t dst = SharedAddress(rope_smem + c * 8);
      const int bytes = valid ? 8 : 0;
      asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(rope + c * 8),
                   "r"(bytes));
    }
    if (lane == 0) {
      CopyAsync4(SharedAddress(raw_scales + r), page + t.fp8_scale_offset + row * 4, valid);
    }
  }
}

// A landed raw FP8 block widened into the bf16 key stage: content e4m3 -> bf16 (exact), rope
// as it is; its scales for the scores and the probabilities.
template <class S>
__device__ void WidenFp8(const char* raw, const float* raw_scales, uint32_t k_smem, float* scales) {
  constexpr int kUnits = kKeys * S::kDvWidth / 16;  // 16 content bytes -> two 16-byte bf16 chunks
  for (int i = threadIdx.x; i < kUnits; i += S::kThreads) {
    const int r = i / (S::kDvWidth / 16);
    const int u = i % (S::kDvWidth / 16);
    const uint4 codes = *reinterpret_cast<const uint4*>(raw + r * S::kDvWidth + u * 16);
    const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
    uint32_t widened[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h));
        const __half2_raw halves = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&halves));
        widened[w * 2 + h] = PackBf16(f.x, f.y);
      }
    }
    const uint32_t dst0 = SwizzledChunk<S::kKChunks>(k_smem, r, u * 2);
    const uint32_t dst1 = SwizzledChunk<S::kKChunks>(k_smem, r, u * 2 + 1);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst0), "r"(widened[0]),
                 "r"(widened[1]), "r"(widened[2]), "r"(widened[3]));
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst1), "r"(widened[4]),
                 "r"(widened[5]), "r"(widened[6]), "r"(widened[7]));
  }
  constexpr int kRopeChunks = S::kDr * 2 / 16;
  for (int i = threadIdx.x; i < kKeys * kRopeChunks; i += S::kThreads) {
    const int r = i / kRopeChunks;
    const int c = i % kRopeChunks;
    const uint4 v =
        *reinterpret_cast<const uint4*>(raw + S::kRawContentBytes + r * S::kDr * 2 + c * 16);
    const uint32_t dst = SwizzledChunk<S::kKChunks>(k_smem, r, S::kDvWidth / 8 + c);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w));
  }
  if (threadIdx.x < kKeys) scales[threadIdx.x] = raw_scales[threadIdx.x];
}

template <int kDk, int kDv, KeysKind kKind, int kColumnWarps>
__global__ void __launch_bounds__(Shape<kDk, kDv, kKind, kColumnWarps>::kThreads, 1)
    AttentionKernel(const AttentionTile* __restrict__ tiles, float scale_log2) {
  using S = Shape<kDk, kDv, kKind, kColumnWarps>;
  constexpr int kWarpCols = S::kDvWidth / kColumnWarps;  // output columns per warp
  constexpr int kOutTiles = kWarpCols / 8;               // n-tiles of the output per warp
  extern __shared__ __align__(128) unsigned char smem[];

  const AttentionTile t = tiles[blockIdx.x];
  if (t.rows == 0) return;  // the empty second of a pair of dense tiles
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wr = warp % 4;  // query rows [16 wr, 16 wr + 16)
  const int wc = warp / 4;  // keys [wc kWarpKeys, +) of a block; columns [wc kWarpCols, +)
  const int g = lane / 4;
  const int c2 = (lane % 4) * 2;
  const int row0 = wr * 16 + g;
  const int row1 = row0 + 8;
  const bool warp_has_rows = wr * 16 < t.rows;

  const uint32_t q_smem = SharedAddress(smem + S::kQOffset);
  const uint32_t p_smem = SharedAddress(smem + S::kPOffset);
  float* red = reinterpret_cast<float*>(smem + S::kRedOffset);
  int* visible = reinterpret_cast<int*>(smem + S::kVisibleOffset);
  float* scales = reinterpret_cast<float*>(smem + S::kScaleOffset);
  float* raw_scales = reinterpret_cast<float*>(smem + S::kRawScaleOffset);
  int32_t* table = reinterpret_cast<int32_t*>(smem + S::kTableOffset);
  char* raw = reinterpret_cast<char*>(smem + S::kRawOffset);
  const auto stage_k = [&](int s) {
    return SharedAddress(smem + S::kStageOffset + s * S::kStageBytes);
  };
  const auto stage_v = [&](int s) {
    return S::kDense ? SharedAddress(smem + S::kStageOffset + s * S::kStageBytes + S::kKBytes)
                     : stage_k(s);
  };

  if (threadIdx.x < kRows) {
    visible[threadIdx.x] =
        threadIdx.x < t.rows ? reinterpret_cast<const int32_t*>(t.visible)[threadIdx.x] : 0;
  }
  if constexpr (!S::kDense) {
    StagePageTable(t, table, S::kThreads);
    __syncthreads();  // the block table
  }
  const int blocks = (t.keys + kKeys - 1) / kKeys;
  LoadQueries<S>(t, q_smem);
  if (blocks > 0) {
    if constexpr (S::kFp8) {
      LoadFp8Raw<S>(t, table, 0, raw, raw_scales);
    } else {
      LoadKeys<S>(t, table, 0, stage_k(0), stage_v(0));
    }
  }
  CopyAsyncCommit();

  float o[kOutTiles][4];
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  TileRows<kColumnWarps> rows(wr * 16 + g, wc, lane);

  for (int b = 0; b < blocks; ++b) {
    CopyAsyncWait<0>();
    __syncthreads();  // block b has landed for every thread; block b - 1 is done with
    int stage = b % S::kStages;
    if constexpr (S::kFp8) {
      WidenFp8<S>(raw, raw_scales, stage_k(0), scales);
      __syncthreads();  // widened; the raw buffer is free
      if (b + 1 < blocks) LoadFp8Raw<S>(t, table, b + 1, raw, raw_scales);
      stage = 0;
    } else {
      if (b + 1 < blocks) LoadKeys<S>(t, table, b + 1, stage_k((b + 1) % 2), stage_v((b + 1) % 2));
    }
    CopyAsyncCommit();
    const uint32_t k_smem = stage_k(stage);
    const uint32_t v_smem = stage_v(stage);

    // Scores of the warp's 16 rows x 32 keys.
    float s[S::kScoreTiles][4];
#pragma unroll
    for (int n = 0; n < S::kScoreTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    if (warp_has_rows) {
#pragma unroll 4
      for (int kk = 0; kk < kDk / 16; ++kk) {
        uint32_t a[4];
        LoadMatrixX4(
            a, SwizzledChunk<S::kQChunks>(q_smem, wr * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < S::kScoreTiles / 2; ++np) {
          uint32_t bb[4];
          LoadMatrixX4(bb,
                       SwizzledChunk<S::kKChunks>(
                           k_smem, wc * S::kWarpKeys + np * 16 + ((lane >> 4) << 3) + (lane & 7),
                           kk * 2 + ((lane >> 3) & 1)));
          MmaBf16(s[np * 2], a, bb[0], bb[1]);
          MmaBf16(s[np * 2 + 1], a, bb[2], bb[3]);
        }
      }
    }
    float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < S::kScoreTiles; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = wc * S::kWarpKeys + n * 8 + c2 + (j & 1);
        const int row = j < 2 ? row0 : row1;
        float v = s[n][j];
        if constexpr (S::kFp8) v *= scales[key];
        v *= scale_log2;
        if (b * kKeys + key >= visible[row]) v = -INFINITY;
        s[n][j] = v;
        block_max[j >> 1] = fmaxf(block_max[j >> 1], v);
      }
    }
    float base[2], alpha[2];
    rows.Advance(block_max[0], block_max[1], red, base, alpha);
    float row_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < S::kScoreTiles; ++n) {
      const int key = wc * S::kWarpKeys + n * 8 + c2;
      float p[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        p[j] = exp2f(s[n][j] - base[j >> 1]);
        row_sum[j >> 1] += p[j];
      }
      if constexpr (S::kFp8) {
        // The value is scale * content: the scale rides on the probability.
        p[0] *= scales[key];
        p[1] *= scales[key + 1];
        p[2] *= scales[key];
        p[3] *= scales[key + 1];
      }
      const uint32_t at0 = SwizzledChunk<8>(p_smem, row0, key / 8) + (key % 8) * 2;
      const uint32_t at1 = SwizzledChunk<8>(p_smem, row1, key / 8) + (key % 8) * 2;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at0), "r"(PackBf16(p[0], p[1])));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at1), "r"(PackBf16(p[2], p[3])));
    }
    rows.Accumulate(row_sum[0], row_sum[1], alpha);
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    __syncthreads();  // every probability of the block is in shared memory

    if (warp_has_rows) {
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t a[4];
        LoadMatrixX4(a, SwizzledChunk<8>(p_smem, wr * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < kOutTiles / 2; ++np) {
          uint32_t bb[4];
          LoadMatrixX4Trans(bb, SwizzledChunk<S::kVChunks>(
                                    v_smem, kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7),
                                    wc * (kWarpCols / 8) + np * 2 + (lane >> 4)));
          MmaBf16(o[np * 2], a, bb[0], bb[1]);
          MmaBf16(o[np * 2 + 1], a, bb[2], bb[3]);
        }
      }
    }
  }

  float total[2];
  rows.Totals(red, total);
  rows.template Store<kOutTiles>(t, total, wc * kWarpCols,
                                 [&](int i, int h, int e) { return o[i][h * 2 + e]; });
}

template <int kDk, int kDv, KeysKind kKind, int kColumnWarps>
cudaError_t Prepare() {
  return cudaFuncSetAttribute(AttentionKernel<kDk, kDv, kKind, kColumnWarps>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Shape<kDk, kDv, kKind, kColumnWarps>::kSharedBytes);
}

template <int kDk, int kDv, KeysKind kKind, int kColumnWarps>
cudaError_t Enqueue(const gpu::Launch& launch, cudaStream_t stream) {
  using S = Shape<kDk, kDv, kKind, kColumnWarps>;
  constexpr float kLog2e = 1.4426950408889634f;
  AttentionKernel<kDk, kDv, kKind, kColumnWarps>
      <<<launch.count, S::kThreads, S::kSharedBytes, stream>>>(
          reinterpret_cast<const AttentionTile*>(launch.tiles), launch.softmax_scale * kLog2e);
  return cudaGetLastError();
}

// Warps sharing a tile's rows. 2 (8 warps a block) and 4 (16) ran at the same speed on an
// H100 (docs/performance.md 10.1: the kernel waits on shared memory, not on latency that
// more warps would hide); 2 needs no register spills.
constexpr int kColumnWarpsServed = 2;

template <int kColumnWarps>
cudaError_t EnqueueWith(const gpu::Launch& launch, cudaStream_t stream) {
  if (launch.dk == 576 && launch.dv == 512 && launch.keys == KeysKind::kPagedBf16) {
    return Enqueue<576, 512, KeysKind::kPagedBf16, kColumnWarps>(launch, stream);
  }
  if (launch.dk == 576 && launch.dv == 512 && launch.keys == KeysKind::kPagedFp8) {
    return Enqueue<576, 512, KeysKind::kPagedFp8, kColumnWarps>(launch, stream);
  }
  if (launch.dk == 192 && launch.dv == 128 && launch.keys == KeysKind::kDense) {
    return Enqueue<192, 128, KeysKind::kDense, kColumnWarps>(launch, stream);
  }
  return cudaErrorNotSupported;
}

}  // namespace

cudaError_t PrepareAttentionKernels() {
  constexpr int w = kColumnWarpsServed;
  for (cudaError_t e :
       {Prepare<576, 512, KeysKind::kPagedBf16, w>(), Prepare<576, 512, KeysKind::kPagedFp8, w>(),
        Prepare<192, 128, KeysKind::kDense, w>()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t EnqueueAttention(const gpu::Launch& launch, cudaStream_t stream) {
  return EnqueueWith<kColumnWarpsServed>(launch, stream);
}

}  // namespace mlaserve::cuda
