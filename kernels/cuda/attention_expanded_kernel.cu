// TyphoonMLA's naive pass on Hopper's warpgroup MMA (sm_90a): the attention tile over expanded
// heads, dense keys of dk 192 (128 content and 64 rope columns) and values of dv 128 (a shared
// prefix's K and V, expanded once per batch). A row group is one head's rows of every query
// on the prefix: for a batch of more than 64 queries, several tiles read the same keys.
//
// A thread block of two warpgroups runs a pair of tiles of one row group (the lowering pairs a
// dense launch's tiles, gpu_jobs.h). A block's products are small here (64 x 64 x 192 for the
// scores, 64 x 128 x 64 for the values, a third of the latent kernels'), so at 64 rows a tile
// the pass is bound by the bytes of keys read, not by the tensor cores:
//
//   two tiles   group g attends tile g's 64 rows to every key block, each block fetched
//               once for both groups by cp.async, three blocks ahead in a ring of four
//               buffers: a key read from memory serves 128 rows; a group's score product
//               for the next block runs while it works out this block's softmax;
//   one tile    (the pair's second holds no rows) group g takes blocks g, g + 2, ..., each
//               into its own two buffers, with its own online softmax and output; at the end
//               group 1 hands its output, maxima and sums to group 0 through shared memory,
//               which merges the two by their maxima.
//
// Each group keeps its rows' output (64 rows x 128 columns) in registers. A row's 64 scores of
// a block lie in one quad of one warp (score_fragments.cuh), so the softmax exchanges nothing
// through shared memory, and the probabilities stay in registers as the value product's A
// operand; one group's softmax runs while the other's products are on the tensor cores.
//
// Shared memory holds Q (3 tiles of 64 columns) and key buffers of K (3 tiles) and V (2
// tiles), as 64-row tiles with the 128-byte swizzle (latent_tiles.cuh's layout): 208 KiB. Same
// contract and numerics as the other attention kernels (attention_kernel.cu): scores in base
// 2, FlashAttention-2 rescaling, natural-log LSE, a row that sees no key gets zeros and -inf;
// keys past the tile's last are zeros.

#include <cuda_bf16.h>

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

using fragments::Exponentiate;
using fragments::kMaxInit;
using fragments::MaskAndMax;
using fragments::PackProbabilities;
using fragments::Rescale;
using fragments::SettleRegisters;
using gpu::AttentionTile;
using latent::kTileBytes;
using latent::TileUnit;

constexpr int kRows = gpu::kAttentionTileRows;   // 64
constexpr int kKeys = gpu::kAttentionBlockKeys;  // 64
constexpr int kThreads = 256;                    // two warpgroups
constexpr int kGroupThreads = 128;
constexpr int kDk = 192;
constexpr int kDv = 128;
constexpr int kKUnits = kDk / 8;  // 16-byte units of a key row
constexpr int kVUnits = kDv / 8;
constexpr int kKTiles = kDk / 64;
constexpr int kBufferBytes = (kDk + kDv) / 64 * kTileBytes;  // a block's K, then its V
constexpr int kQBytes = kKTiles * kTileBytes;
// A tile alone: Q, then group g's two buffers 2 g and 2 g + 1.
constexpr int kQOffset = 0;
constexpr int kAloneBufferOffset = kQBytes;
constexpr int kAloneUsed = kAloneBufferOffset + 4 * kBufferBytes;
// A pair: each group's Q, then a ring of buffers both read.
constexpr int kPairBuffers = 4;
constexpr int kPairBufferOffset = 2 * kQBytes;
constexpr int kPairUsed = kPairBufferOffset + kPairBuffers * kBufferBytes;
constexpr int kSharedUsed = kAloneUsed > kPairUsed ? kAloneUsed : kPairUsed;
constexpr int kSharedBytes = kSharedUsed + 1024;  // the base rounded up to the swizzle's atom
static_assert(kSharedBytes <= 227 * 1024, "more shared memory than a Hopper SM has");
// Group 1's hand-over to group 0 (a tile alone), in group 1's own buffers once it is done with
// them: its outputs (a thread's 64, thread-minor), then its rows' maxima and sums.
constexpr int kHandOutputs = 64 * kGroupThreads;
static_assert((kHandOutputs + 2 * kRows) * 4 <= 2 * kBufferBytes, "hand-over too large");

// Named barriers (0 is __syncthreads): 1 + g within group g.
constexpr int kGroupBarrier = 1;

__device__ __forceinline__ const char* Bytes(gpu::DevicePtr p) {
  return reinterpret_cast<const char*>(p);
}

// Rows [first, first + 64) of a bf16 matrix of kUnits 16-byte units a row, `ld` elements
// apart, into the 64-row tiles at `dst`, by threads [index, +threads); rows at or past `valid`
// are zeros, so that no value a row must not see reaches an MMA.
template <int kUnits>
__device__ void LoadRows(const char* src, int64_t ld, int first, int valid, uint32_t dst, int index,
                         int threads) {
  for (int i = index; i < kRows * kUnits; i += threads) {
    const int r = i / kUnits;
    const int unit = i % kUnits;
    const bool inside = first + r < valid;
    CopyAsync16(TileUnit(dst, r, unit),
                src + (inside ? (static_cast<int64_t>(first + r) * ld + unit * 8) * 2 : 0), inside);
  }
}

// The tile's query rows (zeros past its last), by threads [index, +threads) of the block.
__device__ void LoadQueries(const AttentionTile& t, uint32_t q, int index, int threads) {
  LoadRows<kKUnits>(Bytes(t.q), kDk, 0, t.rows, q, index, threads);
}

// Keys and values [block * kKeys, +kKeys) of `t`'s into `buffer` (K, then V), by threads
// [index, +threads); rows at or past `keys` are zeros.
__device__ void LoadBlock(const AttentionTile& t, int keys, int block, uint32_t buffer, int index,
                          int threads) {
  static_assert(kKeys == kRows, "a key block fills the tiles a query tile does");
  LoadRows<kKUnits>(Bytes(t.base), t.ldk, block * kKeys, keys, buffer, index, threads);
  LoadRows<kVUnits>(Bytes(t.values), t.ldv, block * kKeys, keys, buffer + kKTiles * kTileBytes,
                    index, threads);
}

// A thread's share of fetching blocks, one of kLoaders threads: where each of its 16-byte units
// lands in a buffer and where it comes from past the block's first key row, the same for every
// block, worked out once (the fetch is otherwise as many instructions as the softmax).
template <int kLoaders>
struct BlockCopies {
  static constexpr int kK = kKeys * kKUnits / kLoaders;
  static constexpr int kV = kKeys * kVUnits / kLoaders;
  static_assert(kK * kLoaders == kKeys * kKUnits && kV * kLoaders == kKeys * kVUnits);
  uint32_t k_to[kK], k_from[kK], v_to[kV], v_from[kV];
  int index;
  bool near;  // every offset fits 32 bits

  __device__ BlockCopies(const AttentionTile& t, int index_) : index(index_) {
    near = t.ldk < (1 << 20) && t.ldv < (1 << 20);
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      const int i = index + j * kLoaders;
      k_to[j] = TileUnit(0, i / kKUnits, i % kKUnits);
      k_from[j] = static_cast<uint32_t>((i / kKUnits) * t.ldk + (i % kKUnits) * 8) * 2;
    }
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      const int i = index + j * kLoaders;
      v_to[j] = kKTiles * kTileBytes + TileUnit(0, i / kVUnits, i % kVUnits);
      v_from[j] = static_cast<uint32_t>((i / kVUnits) * t.ldv + (i % kVUnits) * 8) * 2;
    }
  }

  __device__ __forceinline__ void Fetch(const AttentionTile& t, int keys, int block,
                                        uint32_t buffer) const {
    const int first = block * kKeys;
    if (!near || first + kKeys > keys) {  // the last block, part zeros
      LoadBlock(t, keys, block, buffer, index, kLoaders);
      return;
    }
    const char* k = Bytes(t.base) + static_cast<int64_t>(first) * t.ldk * 2;
    const char* v = Bytes(t.values) + static_cast<int64_t>(first) * t.ldv * 2;
#pragma unroll
    for (int j = 0; j < kK; ++j) CopyAsync16(buffer + k_to[j], k + k_from[j], true);
#pragma unroll
    for (int j = 0; j < kV; ++j) CopyAsync16(buffer + v_to[j], v + v_from[j], true);
  }
};

// A warpgroup's rows of one tile: the thread's two rows' running maxima (base 2) and sums (its
// quad's keys), and its share of their 64 x 128 outputs.
struct GroupRows {
  int row;  // and row + 8
  int lane;
  int c2;
  int visible[2];
  float m[2] = {kMaxInit, kMaxInit};
  float l[2] = {0.f, 0.f};
  float o[kDv / 2];

  __device__ GroupRows(const AttentionTile& t, int in_group)
      : row((in_group / 32) * 16 + (in_group % 32) / 4),
        lane(in_group % 32),
        c2((in_group % 4) * 2) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      // Rows past the tile's: answers discarded; no masking on their account.
      visible[h] = r < t.rows ? reinterpret_cast<const int32_t*>(t.visible)[r] : t.keys;
    }
#pragma unroll
    for (int i = 0; i < kDv / 2; ++i) o[i] = 0.f;
  }

  // s = Q K^T for the block whose K is in `keys`, issued and committed (not waited for).
  __device__ __forceinline__ void IssueScores(uint32_t q, uint32_t keys, float (&s)[32]) const {
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      const uint32_t offset = (kk >> 2) * kTileBytes + (kk & 3) * 32;
      WgmmaM64N64(s, SharedDescriptor(q + offset, 16, 1024),
                  SharedDescriptor(keys + offset, 16, 1024), kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
  }

  // The online softmax of the block's settled scores s: the running maxima and sums updated,
  // the probabilities packed into p (the value product's A) and the factor o is to be
  // rescaled by in alpha. Leaves o alone, so that a score product may still be in flight.
  __device__ __forceinline__ void Softmax(float (&s)[32], int block, float scale_log2,
                                          uint32_t (&p)[4][4], float (&alpha)[2]) {
    float block_max[2], base[2], sum[2];
    MaskAndMax(s, scale_log2, block, visible, c2, block_max);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      base[h] = fmaxf(m[h], block_max[h]);
      alpha[h] = exp2f(m[h] - base[h]);
      m[h] = base[h];
    }
    Exponentiate(s, scale_log2, base, sum);
    l[0] = l[0] * alpha[0] + sum[0];
    l[1] = l[1] * alpha[1] + sum[1];
    PackProbabilities(s, p);
  }

  // o = alpha o + P V with the block's V in `keys`, issued and committed; p must stay until
  // it is waited for. No other MMA may be in flight: where o is written while one is, ptxas
  // serialises every warpgroup MMA of the kernel (its warning C7515).
  __device__ __forceinline__ void Values(uint32_t keys, const float (&alpha)[2],
                                         uint32_t (&p)[4][4]) {
    Rescale(o, alpha);
    // V [keys][128 columns] as the MN-major B, 2 tiles of 64 columns (lbo) a k16 step.
    WgmmaFence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      WgmmaM64N128RsTb(
          o, p[j], SharedDescriptor(keys + kKTiles * kTileBytes + j * 16 * 128, kTileBytes, 1024),
          1);
    }
    WgmmaCommit();
  }

  // One block, start to end.
  __device__ __forceinline__ void Attend(uint32_t q, uint32_t keys, int block, float scale_log2) {
    float s[32];
    uint32_t p[4][4];
    float alpha[2];
    IssueScores(q, keys, s);
    WgmmaWait<0>();
    Settle(s);
    Softmax(s, block, scale_log2, p, alpha);
    Values(keys, alpha, p);
    WgmmaWait<0>();
    Settle(o);
    SettleRegisters(p);
  }

  // The rows' totals over the keys this group saw.
  __device__ void Sums(float (&total)[2]) const {
    total[0] = QuadSum(l[0]);
    total[1] = QuadSum(l[1]);
  }

  __device__ void Store(const AttentionTile& t, const float (&total)[2]) const {
    TileRows<1> rows(row, 0, lane);
    rows.m[0] = m[0];
    rows.m[1] = m[1];
    rows.Store<kDv / 8>(t, total, 0, [&](int i, int h, int e) { return o[i * 4 + h * 2 + e]; });
  }
};

// A tile alone: group g takes blocks g, g + 2, ..., each into its own two buffers; group 1
// hands its rows to group 0, which merges and stores.
__device__ __forceinline__ void AttendAlone(const AttentionTile& t, unsigned char* smem,
                                            float scale_log2) {
  const int group = threadIdx.x / kGroupThreads;
  const int in_group = threadIdx.x % kGroupThreads;
  const int blocks = (t.keys + kKeys - 1) / kKeys;
  const uint32_t q = SharedAddress(smem + kQOffset);
  const uint32_t own = SharedAddress(smem + kAloneBufferOffset + 2 * group * kBufferBytes);
  const auto buffer = [&](int n) { return own + static_cast<uint32_t>((n & 1) * kBufferBytes); };
  const BlockCopies<kGroupThreads> copies(t, in_group);

  LoadQueries(t, q, threadIdx.x, kThreads);
  if (group < blocks) copies.Fetch(t, t.keys, group, buffer(0));
  CopyAsyncCommit();
  GroupRows rows(t, in_group);
  CopyAsyncWait<0>();
  FenceSharedForAsyncProxy();
  __syncthreads();  // Q (loaded by both groups) and each group's first block

#pragma unroll 1
  for (int b = group, n = 0; b < blocks; b += 2, ++n) {
    if (n > 0) {
      CopyAsyncWait<0>();
      FenceSharedForAsyncProxy();
    }
    // Block b landed from every thread of the group, and the group is done with block b - 2's
    // buffer, which the next fetch fills.
    NamedBarrierSync(kGroupBarrier + group, kGroupThreads);
    if (b + 2 < blocks) copies.Fetch(t, t.keys, b + 2, buffer(n + 1));
    CopyAsyncCommit();
    rows.Attend(q, buffer(n), b, scale_log2);
  }

  float sums[2];
  rows.Sums(sums);
  float* hand = reinterpret_cast<float*>(smem + kAloneBufferOffset + 2 * kBufferBytes);
  float* hand_max = hand + kHandOutputs;
  float* hand_sum = hand_max + kRows;
  const int row = rows.row;
  if (group == 1) {
    // The hand-over overwrites group 1's buffer 0, whose last block another of its warps'
    // value product may still be reading: the group's barrier first.
    NamedBarrierSync(kGroupBarrier + 1, kGroupThreads);
#pragma unroll
    for (int i = 0; i < kDv / 2; ++i) hand[i * kGroupThreads + in_group] = rows.o[i];
    if (rows.lane % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        hand_max[row + 8 * h] = rows.m[h];
        hand_sum[row + 8 * h] = sums[h];
      }
    }
  }
  __syncthreads();
  if (group == 1) return;
  float total[2], own_factor[2], other_factor[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float other = hand_max[row + 8 * h];
    const float merged = fmaxf(rows.m[h], other);
    own_factor[h] = exp2f(rows.m[h] - merged);
    other_factor[h] = exp2f(other - merged);
    total[h] = sums[h] * own_factor[h] + hand_sum[row + 8 * h] * other_factor[h];
    rows.m[h] = merged;
  }
#pragma unroll
  for (int i = 0; i < kDv / 2; ++i) {
    const int h = (i >> 1) & 1;
    rows.o[i] = rows.o[i] * own_factor[h] + hand[i * kGroupThreads + in_group] * other_factor[h];
  }
  rows.Store(t, total);
}

// Two tiles of one row group (`t` this group's, `keys` the more either sees): each group
// attends its tile's rows to every block, each block fetched once for both by all threads,
// three blocks ahead in a ring of four buffers. A group's score product for block b + 1 runs
// on the tensor cores while it works out block b's softmax.
struct PairPipeline {
  const AttentionTile& t;
  int keys;
  int blocks;
  uint32_t q;
  uint32_t ring;
  float scale_log2;
  const BlockCopies<kThreads>& copies;
  GroupRows& rows;

  __device__ uint32_t Buffer(int b) const {
    return ring + static_cast<uint32_t>((b % kPairBuffers) * kBufferBytes);
  }

  // Block b, whose scores are settled in `now`: issues S(b + 1) into `next` (past the last
  // block, S(b) again, discarded), works out block b's softmax meanwhile, then its values.
  // Every MMA the step issues is waited for within it, in the same order on every path:
  // ptxas, unable to tell which product a wait retires, would otherwise serialise them all.
  __device__ __forceinline__ void Step(int b, float (&now)[32], float (&next)[32]) {
    uint32_t p[4][4];
    float alpha[2];
    if (b + 1 < blocks) {
      CopyAsyncWait<kPairBuffers - 3>();  // block b + 1 (block b + 2 may be in flight)
      FenceSharedForAsyncProxy();
      // Block b + 1 landed from every thread, and both groups are done with block b - 1,
      // whose buffer block b + 3 takes.
      __syncthreads();
      if (b + kPairBuffers - 1 < blocks) {
        copies.Fetch(t, keys, b + kPairBuffers - 1, Buffer(b + kPairBuffers - 1));
      }
      CopyAsyncCommit();
    }
    rows.IssueScores(q, Buffer(min(b + 1, blocks - 1)), next);
    rows.Softmax(now, b, scale_log2, p, alpha);
    WgmmaWait<0>();  // S(b + 1), before o changes
    Settle(next);
    rows.Values(Buffer(b), alpha, p);
    WgmmaWait<0>();
    Settle(rows.o);
    SettleRegisters(p);
  }
};

__device__ __forceinline__ void AttendPair(const AttentionTile& t, int keys, unsigned char* smem,
                                           float scale_log2) {
  const int group = threadIdx.x / kGroupThreads;
  const int in_group = threadIdx.x % kGroupThreads;
  const int blocks = (keys + kKeys - 1) / kKeys;
  const BlockCopies<kThreads> copies(t, threadIdx.x);
  GroupRows rows(t, in_group);
  PairPipeline pipe{t,
                    keys,
                    blocks,
                    SharedAddress(smem + group * kQBytes),
                    SharedAddress(smem + kPairBufferOffset),
                    scale_log2,
                    copies,
                    rows};

  LoadQueries(t, pipe.q, in_group, kGroupThreads);
#pragma unroll
  for (int b = 0; b < kPairBuffers - 1; ++b) {
    if (b < blocks) copies.Fetch(t, keys, b, pipe.Buffer(b));
    CopyAsyncCommit();
  }
  float now[32], next[32];
  if (blocks > 0) {
    CopyAsyncWait<kPairBuffers - 2>();  // Q and block 0 (blocks 1 and 2 may be in flight)
    FenceSharedForAsyncProxy();
    __syncthreads();
    rows.IssueScores(pipe.q, pipe.Buffer(0), now);
    WgmmaWait<0>();
    Settle(now);
  }
#pragma unroll 1
  for (int b = 0; b < blocks; ++b) {
    pipe.Step(b, now, next);
#pragma unroll
    for (int i = 0; i < 32; ++i) now[i] = next[i];
  }
  CopyAsyncWait<0>();
  float total[2];
  rows.Sums(total);
  rows.Store(t, total);
}

// Thread block i runs tiles 2 i and 2 i + 1 (gpu_jobs.h: a dense launch's tiles come in pairs
// of one row group, the same keys and values), apart where the second holds no rows.
__global__ void __launch_bounds__(kThreads, 1)
    AttentionExpandedKernel(const AttentionTile* __restrict__ tiles, int count, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char raw_smem[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(raw_smem) + 1023) & ~static_cast<uintptr_t>(1023));
  const int first = 2 * blockIdx.x;
  const bool pair = first + 1 < count && tiles[first + 1].rows > 0;
  if (pair) {
    const int keys = max(tiles[first].keys, tiles[first + 1].keys);
    const AttentionTile t = tiles[first + threadIdx.x / kGroupThreads];
    AttendPair(t, keys, smem, scale_log2);
  } else {
    const AttentionTile t = tiles[first];
    if (t.rows > 0) AttendAlone(t, smem, scale_log2);
  }
#else
  (void)tiles;
  (void)count;
  (void)scale_log2;
  __trap();  // built without sm_90a: the runtime never picks this kernel there
#endif
}

}  // namespace

cudaError_t PrepareExpandedAttentionKernel() {
  return cudaFuncSetAttribute(AttentionExpandedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSharedBytes);
}

cudaError_t EnqueueExpandedAttention(const gpu::Launch& launch, cudaStream_t stream) {
  if (launch.dk != kDk || launch.dv != kDv || launch.keys != gpu::KeysKind::kDense) {
    return cudaErrorNotSupported;
  }
  constexpr float kLog2e = 1.4426950408889634f;
  AttentionExpandedKernel<<<(launch.count + 1) / 2, kThreads, kSharedBytes, stream>>>(
      reinterpret_cast<const AttentionTile*>(launch.tiles), launch.count,
      launch.softmax_scale * kLog2e);
  return cudaGetLastError();
}

}  // namespace mlaserve::cuda
