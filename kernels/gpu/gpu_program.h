#ifndef MLASERVE_KERNELS_GPU_GPU_PROGRAM_H_
#define MLASERVE_KERNELS_GPU_GPU_PROGRAM_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/gpu/gpu_jobs.h"

namespace mlaserve::gpu {

// What a GPU runs for one batch, one expansion or one flush of written pages: one
// host-to-device copy of `upload_bytes` (job records, block tables, the queries, KV rows),
// launches in order on one stream, then one device-to-host copy of `download_bytes` (the
// answers). Launches read their records from the uploaded bytes; nothing else crosses the
// bus. A runtime (gpu_runtime.h) executes it; the lowering (gpu_lowering.h) writes it.
enum class LaunchKind {
  kCopyRows,   // CopyRowsJob [count]
  kFill,       // FillJob [count]
  kGemm,       // GemmTile [count] over GemmJob records at `records`
  kAttention,  // AttentionTile [count], all of `keys` kind, dk x dv
  kCombine,    // CombineTile [count] over CombineJob records at `records`
};

const char* LaunchKindName(LaunchKind kind);

struct Launch {
  LaunchKind kind = LaunchKind::kCopyRows;
  std::string name;       // the step it lowers ("latent", "absorb_q", ...), for errors
  DevicePtr tiles = 0;    // the per-block records: count of them
  int32_t count = 0;      // thread blocks (copy and fill: jobs)
  DevicePtr records = 0;  // kGemm, kCombine: the job records the tiles index
  // kGemm whose every job fits the row kernel (at most kGemvMaxRows rows, depth at most
  // kGemvMaxDepth, B's rows and columns in whole 16-byte vectors): the most rows of any job,
  // so that a runtime may read B once at memory bandwidth with the rows in registers instead
  // of through 64-row tiles; 0 otherwise.
  int32_t gemv_rows = 0;
  bool aligned16 = false;  // kCopyRows: every address, stride and length a multiple of 16
  // kAttention
  KeysKind keys = KeysKind::kPagedBf16;
  int32_t dk = 0;
  int32_t dv = 0;
  float softmax_scale = 0;
  int32_t max_tile_rows = 0;  // the most rows of any of the launch's tiles
  // kAttention over the bf16 paged cache when every tile's keys are whole blocks of
  // kAttentionBlockKeys rows of one pool (pages a multiple of that, every tile starting on a
  // block): the pool as a matrix of `key_pool_rows` key rows `key_row_stride` bytes apart, so
  // that a kernel can fetch a block with the bulk tensor copy. key_pool_rows 0 otherwise.
  DevicePtr key_pool = 0;
  int64_t key_pool_rows = 0;
  int64_t key_row_stride = 0;
};

struct Program {
  DevicePtr upload_to = 0;
  int64_t upload_bytes = 0;
  std::vector<Launch> launches;
  DevicePtr download_from = 0;
  int64_t download_bytes = 0;
  // What the upload carries besides job records: the staged queries, and the caller's
  // copies (KV rows written since the last program).
  int64_t query_bytes = 0;
  int64_t copied_bytes = 0;
  // Staged queries the copy launch reads in place from mapped host memory (not uploaded).
  int64_t in_place_bytes = 0;
};

// Where a program's bytes are on the host while it runs (pinned memory on a real GPU).
struct ProgramIo {
  std::span<const std::byte> upload;  // upload_bytes
  std::span<std::byte> download;      // download_bytes
};

// What one run cost, from the device's own clock where it has one.
struct ProgramTiming {
  double upload_ms = 0;
  double kernels_ms = 0;  // first launch to last, on the device
  double download_ms = 0;
};

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_GPU_PROGRAM_H_
