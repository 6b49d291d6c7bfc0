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
// A launch whose tiles hold at most 16 rows (few heads: 16 with 8-way tensor parallelism) runs
// the narrow shape instead: one row of eight warps, each taking 8 keys of a block and 64
// output columns, so that no warp idles on rows the tile does not have and the tensor cores do
// 16 rows' work, not 64's; its score products run as two chains (even and odd k steps) so that
// they are not bound by the MMA's latency. There the FP8 cache keeps a ring of three raw
// blocks (two landing while one is widened), for which shared memory has room with 16 query
// rows. On Hopper a raw FP8 block whose keys are whole 64-row runs of a page comes by
// three bulk copies issued by one thread instead of every thread's cp.async (whose address
// arithmetic, not the bytes, bounded the kernel).
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
#include "kernels/cuda/tma.cuh"

namespace mlaserve::cuda {
namespace {

using gpu::AttentionTile;
using gpu::KeysKind;

constexpr int kRows = gpu::kAttentionTileRows;
constexpr int kKeys = 64;  // keys per block

template <int kDk, int kDv, KeysKind kKind, int kRowWarps, int kColumnWarps>
struct Shape {
  // kRowWarps x kColumnWarps warps: warp (r, c) owns query rows [16 r, +16), keys
  // [c kWarpKeys, +) of each block for the scores, output columns [c kWarpCols, +) for the
  // values.
  static constexpr int kThreads = kRowWarps * kColumnWarps * 32;
  static constexpr int kTileRows = kRowWarps * 16;  // rows of the tile the shape takes
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
  // Raw FP8 blocks in flight: one (it lands while the block before is computed) where the
  // query rows leave no room for more.
  static constexpr int kRawStages = kFp8 ? (kRowWarps == 1 ? 3 : 1) : 0;
  // Independent accumulator chains of a score product.
  static constexpr int kScoreChains = kRowWarps == 1 ? 2 : 1;
  static constexpr int kKBytes = kKeys * kDk * 2;
  static constexpr int kVBytes = kDense ? kKeys * kDv * 2 : 0;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  // FP8: a block's raw content [kKeys][dv] e4m3, rope [kKeys][dr] bf16, scales [kKeys] fp32.
  static constexpr int kRawContentBytes = kFp8 ? kKeys * kDv : 0;
  static constexpr int kRawRopeBytes = kFp8 ? kKeys * kDr * 2 : 0;
  static constexpr int kRawStageBytes = kRawContentBytes + kRawRopeBytes;

  static constexpr int kQOffset = 0;
  static constexpr int kStageOffset = kQOffset + kTileRows * kDk * 2;
  static constexpr int kRawOffset = kStageOffset + kStages * kStageBytes;
  static constexpr int kPOffset = kRawOffset + kRawStages * kRawStageBytes;
  static constexpr int kRedOffset = kPOffset + kTileRows * kKeys * 2;  // float [warps][kRows]
  static constexpr int kVisibleOffset = kRedOffset + kColumnWarps * kRows * 4;  // int32
  static constexpr int kScaleOffset = kVisibleOffset + kRows * 4;               // float [kKeys]
  // float [kRawStages][kKeys]
  static constexpr int kRawScaleOffset = kScaleOffset + kKeys * 4;
  static constexpr int kTableOffset = kRawScaleOffset + kRawStages * kKeys * 4;  // int32
  // uint64 [kRawStages]: the raw blocks' bulk copies complete on these.
  static constexpr int kBarrierOffset =
      (kTableOffset + (kDense ? 0 : kSharedTablePages * 4) + 7) / 8 * 8;
  static constexpr int kSharedBytes = kBarrierOffset + kRawStages * 8;

  static_assert(kDk % 64 == 0 && kDv % 64 == 0 && kDv <= kDk, "unsupported widths");
  static_assert(kSharedBytes <= 227 * 1024, "more shared memory than a Hopper SM has");
};

__device__ __forceinline__ const char* Bytes(gpu::DevicePtr p) {
  return reinterpret_cast<const char*>(p);
}

// Rows of the tile's queries, zeros past its last row.
template <class S>
__device__ void LoadQueries(const AttentionTile& t, uint32_t q_smem) {
  for (int i = threadIdx.x; i < S::kTileRows * S::kQChunks; i += S::kThreads) {
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

// Whether a tile's raw FP8 blocks can come by the bulk copy: each block's 64 keys within one
// page from a multiple of 64 on, so that its content, rope and scales are three runs of bytes,
// all 16-byte aligned.
__device__ __forceinline__ bool Fp8BlocksBulk(const AttentionTile& t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t addresses = static_cast<uint64_t>(t.base) |
                             static_cast<uint64_t>(t.page_stride) |
                             static_cast<uint64_t>(t.fp8_scale_offset) |
                             static_cast<uint64_t>(t.fp8_rope_offset);
  return t.page_size % kKeys == 0 && t.first_token % kKeys == 0 && (addresses & 15) == 0;
#else
  return false;
#endif
}

// The same bytes as LoadFp8Raw by three bulk copies issued by the calling thread, completing
// on `barrier`; rows past the tile's keys are left as they are (WidenFp8 zeroes them).
template <class S>
__device__ void LoadFp8RawBulk(const AttentionTile& t, const int32_t* table, int block, char* raw,
                               float* raw_scales, uint32_t barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int valid = min(kKeys, t.keys - block * kKeys);
  int row = 0;
  const char* page = PageOf(t, table, block * kKeys, &row);
  const uint32_t content = valid * S::kDvWidth;
  const uint32_t rope = valid * S::kDr * 2;
  const uint32_t scales = (valid * 4 + 15) / 16 * 16;  // within the page: its rows go on to 64
  // The buffer was last read by the block's threads' ordinary loads (a barrier before this):
  // ordered before the copy engine's writes into it.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  MbarrierExpectBytes(barrier, content + rope + scales);
  BulkLoad(SharedAddress(raw), page + static_cast<int64_t>(row) * S::kDvWidth, content, barrier);
  BulkLoad(SharedAddress(raw + S::kRawContentBytes),
           page + t.fp8_rope_offset + static_cast<int64_t>(row) * S::kDr * 2, rope, barrier);
  BulkLoad(SharedAddress(raw_scales), page + t.fp8_scale_offset + row * 4, scales, barrier);
#endif
}

// A landed raw FP8 block widened into the bf16 key stage: content e4m3 -> bf16 (exact), rope
// as it is; its scales for the scores and the probabilities. Rows from `valid` on become
// zeros, scale 0 (what a bulk copy left there may be anything).
template <class S>
__device__ void WidenFp8(const char* raw, const float* raw_scales, uint32_t k_smem, float* scales,
                         int valid) {
  constexpr int kUnits = kKeys * S::kDvWidth / 16;  // 16 content bytes -> two 16-byte bf16 chunks
  // Unrolled: a thread's units are independent, so their loads and conversions overlap.
#pragma unroll 4
  for (int i = threadIdx.x; i < kUnits; i += S::kThreads) {
    const int r = i / (S::kDvWidth / 16);
    const int u = i % (S::kDvWidth / 16);
    uint4 codes = *reinterpret_cast<const uint4*>(raw + r * S::kDvWidth + u * 16);
    if (r >= valid) codes = make_uint4(0, 0, 0, 0);
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
#pragma unroll
  for (int i = threadIdx.x; i < kKeys * kRopeChunks; i += S::kThreads) {
    const int r = i / kRopeChunks;
    const int c = i % kRopeChunks;
    uint4 v = *reinterpret_cast<const uint4*>(raw + S::kRawContentBytes + r * S::kDr * 2 + c * 16);
    if (r >= valid) v = make_uint4(0, 0, 0, 0);
    const uint32_t dst = SwizzledChunk<S::kKChunks>(k_smem, r, S::kDvWidth / 8 + c);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w));
  }
  if (threadIdx.x < kKeys) scales[threadIdx.x] = threadIdx.x < valid ? raw_scales[threadIdx.x] : 0.f;
}

template <int kDk, int kDv, KeysKind kKind, int kRowWarps, int kColumnWarps>
__global__ void __launch_bounds__(Shape<kDk, kDv, kKind, kRowWarps, kColumnWarps>::kThreads, 1)
    AttentionKernel(const AttentionTile* __restrict__ tiles, float scale_log2) {
  using S = Shape<kDk, kDv, kKind, kRowWarps, kColumnWarps>;
  constexpr int kWarpCols = S::kDvWidth / kColumnWarps;  // output columns per warp
  constexpr int kOutTiles = kWarpCols / 8;               // n-tiles of the output per warp
  extern __shared__ __align__(128) unsigned char smem[];

  const AttentionTile t = tiles[blockIdx.x];
  if (t.rows == 0) return;  // the empty second of a pair of dense tiles
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wr = warp % kRowWarps;  // query rows [16 wr, 16 wr + 16)
  const int wc = warp / kRowWarps;  // keys [wc kWarpKeys, +) of a block; columns [wc kWarpCols, +)
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
  const auto raw = [&](int buffer) {
    return reinterpret_cast<char*>(smem + S::kRawOffset + buffer * S::kRawStageBytes);
  };
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
  const uint32_t barriers = SharedAddress(smem + S::kBarrierOffset);
  [[maybe_unused]] const bool bulk = S::kFp8 && Fp8BlocksBulk(t);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (S::kFp8) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < S::kRawStages; ++i) MbarrierInit(barriers + i * 8, 1);
      FenceBarrierInit();
      FenceSharedForAsyncProxy();  // the initialised barriers, seen by the copy engine too
    }
  }
#endif
  if constexpr (!S::kDense) {
    StagePageTable(t, table, S::kThreads);
    __syncthreads();  // the block table (and the barriers)
  }
  const int blocks = (t.keys + kKeys - 1) / kKeys;
  // Raw FP8 block `block` into buffer `buffer`: by the bulk copy where the tile allows (one
  // thread), else by every thread's cp.async; a commit group either way.
  [[maybe_unused]] const auto load_raw = [&](int block, int buffer) {
    if (block < blocks) {
      if (!bulk) {
        LoadFp8Raw<S>(t, table, block, raw(buffer), raw_scales + buffer * kKeys);
      } else if (threadIdx.x == 0) {
        LoadFp8RawBulk<S>(t, table, block, raw(buffer), raw_scales + buffer * kKeys,
                          barriers + buffer * 8);
      }
    }
    CopyAsyncCommit();
  };
  [[maybe_unused]] const auto valid_keys = [&](int block) {
    return min(kKeys, t.keys - block * kKeys);
  };
  LoadQueries<S>(t, q_smem);
  if constexpr (S::kFp8) {
    // Raw blocks 0 .. kRawStages - 2 (block 0 alone with one buffer).
    for (int i = 0; i < (S::kRawStages > 1 ? S::kRawStages - 1 : 1); ++i) load_raw(i, i);
    // The queries' cp.async copies: the bulk path's waits are on its barriers only.
    if (bulk) CopyAsyncWait<0>();
  } else {
    if (blocks > 0) LoadKeys<S>(t, table, 0, stage_k(0), stage_v(0));
    CopyAsyncCommit();
  }

  float o[kOutTiles][4];
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  TileRows<kColumnWarps> rows(wr * 16 + g, wc, lane);

  for (int b = 0; b < blocks; ++b) {
    const int stage = b % S::kStages;  // the FP8 cache widens into its one stage
    if constexpr (S::kFp8) {
      constexpr int kRing = S::kRawStages;
      // Commit groups issued after block b's (a ring's blocks ahead), left pending by its wait.
      constexpr int kAhead = kRing > 2 ? kRing - 2 : 0;
      const int buffer = b % kRing;
      // Raw block b has landed for this thread: its buffer's barrier, whose phase counts the
      // buffer's uses, or every commit group but the kAhead after it.
      if (bulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        MbarrierWait(barriers + buffer * 8, (b / kRing) & 1);
#endif
      } else {
        CopyAsyncWait<kAhead>();
      }
      __syncthreads();  // block b has landed for every thread; block b - 1 is done with
      // A ring refills the buffer block b - 1 was widened from before widening block b; a lone
      // buffer is refilled once widened.
      if constexpr (kRing > 1) load_raw(b + kRing - 1, (b + kRing - 1) % kRing);
      WidenFp8<S>(raw(buffer), raw_scales + buffer * kKeys, stage_k(0), scales, valid_keys(b));
      __syncthreads();  // widened
      if constexpr (kRing == 1) load_raw(b + 1, 0);
    } else {
      CopyAsyncWait<0>();
      __syncthreads();  // block b has landed for every thread; block b - 1 is done with
      if (b + 1 < blocks) LoadKeys<S>(t, table, b + 1, stage_k((b + 1) % 2), stage_v((b + 1) % 2));
      CopyAsyncCommit();
    }
    const uint32_t k_smem = stage_k(stage);
    const uint32_t v_smem = stage_v(stage);

    // Scores of the warp's 16 rows x kWarpKeys keys, in kScoreChains chains over the k steps.
    float chains[S::kScoreChains][S::kScoreTiles][4];
#pragma unroll
    for (int ch = 0; ch < S::kScoreChains; ++ch) {
#pragma unroll
      for (int n = 0; n < S::kScoreTiles; ++n) {
        chains[ch][n][0] = chains[ch][n][1] = chains[ch][n][2] = chains[ch][n][3] = 0.f;
      }
    }
    if (warp_has_rows) {
      static_assert((kDk / 16) % S::kScoreChains == 0, "k steps split evenly between chains");
#pragma unroll 2
      for (int k0 = 0; k0 < kDk / 16; k0 += S::kScoreChains) {
#pragma unroll
        for (int ch = 0; ch < S::kScoreChains; ++ch) {
          const int kk = k0 + ch;
          uint32_t a[4];
          LoadMatrixX4(
              a, SwizzledChunk<S::kQChunks>(q_smem, wr * 16 + (lane & 15), kk * 2 + (lane >> 4)));
          if constexpr (S::kScoreTiles == 1) {
            uint32_t bb[2];  // lanes 0-15 address the warp's 8 keys, both halves of the k step
            LoadMatrixX2(bb, SwizzledChunk<S::kKChunks>(k_smem, wc * S::kWarpKeys + (lane & 7),
                                                        kk * 2 + ((lane >> 3) & 1)));
            MmaBf16(chains[ch][0], a, bb[0], bb[1]);
          }
#pragma unroll
          for (int np = 0; np < S::kScoreTiles / 2; ++np) {
            uint32_t bb[4];
            LoadMatrixX4(bb,
                         SwizzledChunk<S::kKChunks>(
                             k_smem, wc * S::kWarpKeys + np * 16 + ((lane >> 4) << 3) + (lane & 7),
                             kk * 2 + ((lane >> 3) & 1)));
            MmaBf16(chains[ch][np * 2], a, bb[0], bb[1]);
            MmaBf16(chains[ch][np * 2 + 1], a, bb[2], bb[3]);
          }
        }
      }
    }
    float(&s)[S::kScoreTiles][4] = chains[0];
#pragma unroll
    for (int ch = 1; ch < S::kScoreChains; ++ch) {
#pragma unroll
      for (int n = 0; n < S::kScoreTiles; ++n) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s[n][j] += chains[ch][n][j];
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

// The served shapes, as rows x columns of warps. The full shape: 2 columns (8 warps a block)
// and 4 (16) ran at the same speed on an H100 (docs/performance.md 10.1: the kernel waits on
// shared memory, not on latency that more warps would hide); 2 needs no register spills.
struct Full {
  static constexpr int kRowWarps = 4;
  static constexpr int kColumnWarps = 2;
};
// The narrow shape, for launches whose tiles hold at most 16 rows: eight warps of 8 keys and
// 64 output columns each (four of 16 keys and 128 columns ran no faster than the full shape:
// a warp a scheduler waits on each instruction's latency).
struct Narrow {
  static constexpr int kRowWarps = 1;
  static constexpr int kColumnWarps = 8;
};

template <int kDk, int kDv, KeysKind kKind, class W>
cudaError_t Prepare() {
  return cudaFuncSetAttribute(AttentionKernel<kDk, kDv, kKind, W::kRowWarps, W::kColumnWarps>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Shape<kDk, kDv, kKind, W::kRowWarps, W::kColumnWarps>::kSharedBytes);
}

template <int kDk, int kDv, KeysKind kKind, class W>
cudaError_t Enqueue(const gpu::Launch& launch, cudaStream_t stream) {
  using S = Shape<kDk, kDv, kKind, W::kRowWarps, W::kColumnWarps>;
  constexpr float kLog2e = 1.4426950408889634f;
  AttentionKernel<kDk, kDv, kKind, W::kRowWarps, W::kColumnWarps>
      <<<launch.count, S::kThreads, S::kSharedBytes, stream>>>(
          reinterpret_cast<const AttentionTile*>(launch.tiles), launch.softmax_scale * kLog2e);
  return cudaGetLastError();
}

}  // namespace

bool NarrowAttentionTakes(const gpu::Launch& launch) {
  return launch.dk == 576 && launch.dv == 512 && launch.keys != KeysKind::kDense &&
         launch.max_tile_rows > 0 && launch.max_tile_rows <= Narrow::kRowWarps * 16;
}

cudaError_t PrepareAttentionKernels() {
  for (cudaError_t e : {Prepare<576, 512, KeysKind::kPagedBf16, Full>(),
                        Prepare<576, 512, KeysKind::kPagedFp8, Full>(),
                        Prepare<192, 128, KeysKind::kDense, Full>(),
                        Prepare<576, 512, KeysKind::kPagedBf16, Narrow>(),
                        Prepare<576, 512, KeysKind::kPagedFp8, Narrow>()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t EnqueueAttention(const gpu::Launch& launch, bool narrow, cudaStream_t stream) {
  narrow = narrow && NarrowAttentionTakes(launch);
  if (launch.dk == 576 && launch.dv == 512 && launch.keys == KeysKind::kPagedBf16) {
    return narrow ? Enqueue<576, 512, KeysKind::kPagedBf16, Narrow>(launch, stream)
                  : Enqueue<576, 512, KeysKind::kPagedBf16, Full>(launch, stream);
  }
  if (launch.dk == 576 && launch.dv == 512 && launch.keys == KeysKind::kPagedFp8) {
    return narrow ? Enqueue<576, 512, KeysKind::kPagedFp8, Narrow>(launch, stream)
                  : Enqueue<576, 512, KeysKind::kPagedFp8, Full>(launch, stream);
  }
  if (launch.dk == 192 && launch.dv == 128 && launch.keys == KeysKind::kDense) {
    return Enqueue<192, 128, KeysKind::kDense, Full>(launch, stream);
  }
  return cudaErrorNotSupported;
}

}  // namespace mlaserve::cuda
