#ifndef MLASERVE_KERNELS_GPU_GPU_JOBS_H_
#define MLASERVE_KERNELS_GPU_GPU_JOBS_H_

// The job records a GPU launch reads from device memory, one struct per kind of launch. They
// are plain data shared by the C++ lowering (gpu_lowering.h), the fake runtime that executes
// them with the host kernels (fake_gpu_runtime.h) and the CUDA kernels (kernels/cuda/), so
// this header includes nothing but <cstdint> and nvcc compiles it as it is. Every address is
// a device address (DevicePtr); strides are in elements unless a name says bytes.

#include <cstdint>

namespace mlaserve::gpu {

using DevicePtr = uint64_t;

// Bytes to copy as `rows` rows of `row_bytes`, `src_stride` and `dst_stride` bytes apart.
// The lowering keeps every address, stride and length a multiple of 16 where it can
// (kCopyAligned16), so the kernel moves 16-byte vectors; other copies go 2 bytes at a time.
struct CopyRowsJob {
  DevicePtr src = 0;
  DevicePtr dst = 0;
  int64_t src_stride = 0;  // bytes
  int64_t dst_stride = 0;  // bytes
  int32_t rows = 0;
  int32_t row_bytes = 0;
};

// `words` 32-bit words from `dst` set to `pattern` (0 for zeros, 0xff800000 for -inf fp32).
struct FillJob {
  DevicePtr dst = 0;
  int64_t words = 0;
  uint32_t pattern = 0;
  uint32_t unused = 0;
};
inline constexpr uint32_t kFillZero = 0;
inline constexpr uint32_t kFillNegInfinity = 0xff800000u;

// C [rows][n] = A [rows][k] . B, B [k][n] or (transpose_b) [n][k]; bf16 operands, fp32
// accumulation, C fp32 or rounded to bf16 (nearest even). Optional row_scale (fp32 [rows]):
// C[r][:] = row_scale[r] * (A . B)[r][:] before C's rounding.
struct GemmJob {
  DevicePtr a = 0;
  DevicePtr b = 0;
  DevicePtr c = 0;
  DevicePtr row_scale = 0;  // 0: none
  int64_t lda = 0;
  int64_t ldb = 0;
  int64_t ldc = 0;
  int32_t rows = 0;
  int32_t n = 0;
  int32_t k = 0;
  int32_t transpose_b = 0;
  int32_t c_bf16 = 0;
  int32_t unused = 0;
};

// One thread block of a GEMM launch: C rows [row0, row0 + kGemmTileRows) and columns
// [col0, col0 + kGemmTileCols) of job `job`, clipped to its shape.
struct GemmTile {
  int32_t job = 0;
  int32_t row0 = 0;
  int32_t col0 = 0;
  int32_t unused = 0;
};
inline constexpr int kGemmTileRows = 64;
inline constexpr int kGemmTileCols = 64;
// The row kernel's bounds (Launch::gemv_rows): a decode batch's projections for a few
// sequences (one query's absorb_q and project_out: 1 row a head, depth 128 and 512). From 8
// rows on the tiled GEMM is as fast or faster (docs/performance.md 14.2).
inline constexpr int kGemvMaxRows = 4;
inline constexpr int kGemvMaxDepth = 512;

// Where an attention tile's keys are.
enum class KeysKind : int32_t {
  // The bf16 latent cache: token t is row (first_token + t) % page_size of page
  // pages[(first_token + t) / page_size], at base + page * page_stride + row * row_stride
  // (bytes); values are the first dv columns of the keys.
  kPagedBf16 = 0,
  // SnapMLA's FP8 cache (kernels/core/fp8_paged_kv_cache.h): the key is
  // scale * [e4m3 content | rope], the value scale * content.
  kPagedFp8 = 1,
  // Dense keys [keys][ldk] at `base`, values [keys][ldv] at `values` (an expanded head).
  kDense = 2,
};

// One thread block of an attention launch: up to kAttentionTileRows query rows of one row
// group (bf16 [rows][dk], dense), row i attending to keys [0, visible[i]). Output: rows
// out_stride elements apart (fp32, or bf16 if out_bf16) and natural-log LSEs lse_stride
// apart; a row that sees no key gets zeros and -inf. A launch's dense tiles come in pairs of
// one row group (2 i and 2 i + 1, the same keys and values), so that a kernel may read each key
// once for both; a pair's second may hold no rows (rows and keys 0), and is then skipped.
struct AttentionTile {
  DevicePtr q = 0;
  DevicePtr visible = 0;  // int32 [rows]
  DevicePtr out = 0;
  DevicePtr lse = 0;
  int64_t out_stride = 0;
  int64_t lse_stride = 0;
  int32_t rows = 0;
  int32_t keys = 0;  // the most any row sees
  int32_t out_bf16 = 0;
  KeysKind kind = KeysKind::kPagedBf16;
  // Keys, by kind.
  DevicePtr base = 0;       // the pool, or the dense keys
  DevicePtr values = 0;     // kDense: the dense values
  DevicePtr pages = 0;      // paged: int32 block table
  int64_t ldk = 0;          // kDense, elements
  int64_t ldv = 0;          // kDense, elements
  int64_t page_stride = 0;  // paged, bytes
  int64_t row_stride = 0;   // kPagedBf16, bytes
  int32_t page_size = 0;    // paged
  int32_t first_token = 0;  // paged
  // kPagedFp8: the sections of a page (Fp8PageLayout), bytes from the page's start.
  int64_t fp8_scale_offset = 0;
  int64_t fp8_rope_offset = 0;
};
inline constexpr int kAttentionTileRows = 64;
// Keys the attention kernels step by: split-KV parts are made of whole such blocks.
inline constexpr int kAttentionBlockKeys = 64;
// What a split-KV part costs beyond its keys, in such blocks: its queries' load, the first
// block's wait, its partial output written and merged (about 8 on an H100, from the kernel
// benchmark's split and unsplit times: docs/performance.md 10.1).
inline constexpr int kAttentionPartOverheadBlocks = 8;

// Partial results of the same rows over disjoint keys, merged by LSE (CombineLseParts): part
// p is `parts`[p] = {out [rows][dv] fp32 dense, lse [rows] fp32}.
struct CombinePart {
  DevicePtr out = 0;
  DevicePtr lse = 0;
};
struct CombineJob {
  DevicePtr parts = 0;  // CombinePart [num_parts]
  DevicePtr out = 0;
  DevicePtr lse = 0;
  int64_t out_stride = 0;
  int64_t lse_stride = 0;
  int32_t num_parts = 0;
  int32_t rows = 0;
  int32_t dv = 0;
  int32_t out_bf16 = 0;
};
// One thread block of a combine launch: rows [row0, row0 + kCombineTileRows) of job `job`,
// columns [col0, col0 + cols). The tile with col0 0 writes the rows' LSEs. A job's rows are
// cut into column slices only where its LSE destination is none of its parts' (each slice
// reads every part's LSE, which an in-place merge would overwrite under another slice).
struct CombineTile {
  int32_t job = 0;
  int32_t row0 = 0;
  int32_t col0 = 0;
  int32_t cols = 0;
};
inline constexpr int kCombineTileRows = 8;
// Columns of a slice: a few rows of many parts (one query split over the SMs) still make
// enough thread blocks to read the parts at the memory's rate.
inline constexpr int kCombineSliceColumns = 128;
inline constexpr int kCombineMaxDv = 512;  // the widest row a combine takes (MLA's latent)

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_GPU_JOBS_H_
