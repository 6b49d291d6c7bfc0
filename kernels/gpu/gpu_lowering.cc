#include "kernels/gpu/gpu_lowering.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/gpu/upload_writer.h"

namespace mlaserve::gpu {
namespace {

// Buffers start on 256-byte boundaries (what cudaMalloc gives), so every vector access a
// kernel makes from a buffer's start is aligned, and a fill may round up to whole words.
constexpr int64_t kBufferAlignment = 256;

int64_t AlignUp(int64_t x, int64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

bool Aligned16(int64_t x) { return x % 16 == 0; }

// Whether a GEMM job fits the row kernel (Launch::gemv_rows): few rows, a bounded depth, and
// B read as whole 16-byte vectors along its contiguous dimension (depth when B is [n][k],
// columns when it is [k][n]).
bool FitsRowKernel(const GemmJob& j) {
  const int64_t contiguous = j.transpose_b ? j.k : j.n;
  return j.rows <= kGemvMaxRows && j.k <= kGemvMaxDepth && Aligned16(static_cast<int64_t>(j.b)) &&
         j.ldb % 8 == 0 && contiguous % 8 == 0;
}

// What one thread block of a fill (64 KiB) or a copy (16 KiB: a thread's few vectors, so that
// one query's rows spread over several SMs) takes.
constexpr int64_t kFillJobWords = int64_t{16} << 10;
constexpr int64_t kCopyJobBytes = int64_t{16} << 10;

class Lowerer {
 public:
  // Counting (`resolve` null: no address is real) or emitting.
  Lowerer(const BatchSteps& steps, std::span<const UploadCopy> copies, const BatchLayout& layout,
          DevicePtr arena, const InputResolver* resolve, std::byte* upload)
      : steps_(steps),
        copies_(copies),
        staged_in_place_(layout.staged_in_place),
        resolve_(resolve),
        upload_(upload, arena + static_cast<DevicePtr>(layout.upload_offset)) {
    base_.resize(steps.buffers.size(), 0);
    for (size_t i = 0; i < steps.buffers.size(); ++i) {
      if (layout.buffer_offsets[i] >= 0)
        base_[i] = arena + static_cast<DevicePtr>(layout.buffer_offsets[i]);
    }
  }

  int64_t upload_bytes() const { return upload_.size(); }
  int64_t query_bytes() const { return query_bytes_; }
  int64_t copied_bytes() const { return copied_bytes_; }
  int64_t in_place_bytes() const { return in_place_bytes_; }
  std::vector<Launch>& launches() { return launches_; }

  absl::Status Run() {
    if (resolve_ != nullptr) RETURN_IF_ERROR(ResolveInputs());
    EmitCopies();
    RETURN_IF_ERROR(EmitFills());
    for (const BatchStep& step : steps_.steps) {
      if (const auto* p = std::get_if<ProjectionStep>(&step)) {
        RETURN_IF_ERROR(EmitProjection(*p));
      } else if (const auto* a = std::get_if<AttentionStep>(&step)) {
        EmitAttention(*a);
      } else {
        RETURN_IF_ERROR(EmitCombine(std::get<CombineStep>(step)));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status ResolveInputs() {
    for (size_t i = 0; i < steps_.buffers.size(); ++i) {
      const StepBuffer& b = steps_.buffers[i];
      if (b.kind != StepBuffer::Kind::kInput) continue;
      absl::StatusOr<DevicePtr> at = (*resolve_)(b);
      if (!at.ok()) {
        return absl::InternalError(absl::StrCat(
            "input buffer '", b.name, "' is not in device memory: ", at.status().message()));
      }
      base_[i] = *at;
    }
    return absl::OkStatus();
  }

  DevicePtr Address(const BufferRef& ref) const {
    const StepBuffer& b = steps_.buffers[ref.buffer];
    return base_[ref.buffer] + static_cast<DevicePtr>(ref.offset * ElementBytes(b.type));
  }

  void AddLaunch(Launch launch) { launches_.push_back(std::move(launch)); }

  // The queries (and the caller's extra copies) packed into the upload, then copied from
  // there to their places by one launch.
  void EmitCopies() {
    std::vector<CopyRowsJob> jobs;
    bool aligned = true;
    for (const UploadCopy& c : copies_) {
      const DevicePtr src = upload_.Put(c.src, c.bytes);
      copied_bytes_ += c.bytes;
      // Pieces of at most kCopyJobBytes, one thread block each (a registration brings pages).
      for (int64_t at = 0; at < c.bytes; at += kCopyJobBytes) {
        const int64_t n = std::min(kCopyJobBytes, c.bytes - at);
        jobs.push_back(CopyRowsJob{src + static_cast<DevicePtr>(at),
                                   c.dst + static_cast<DevicePtr>(at), n, n, 1,
                                   static_cast<int32_t>(n)});
      }
      aligned = aligned && Aligned16(static_cast<int64_t>(c.dst)) && Aligned16(c.bytes) &&
                Aligned16(std::min(kCopyJobBytes, c.bytes));
    }
    for (size_t i = 0; i < steps_.staging.size(); ++i) {
      const StageCopy& s = steps_.staging[i];
      const int64_t row_bytes = int64_t{s.width} * 2;
      if (row_bytes <= 0 || s.rows <= 0) continue;  // nothing to copy
      const DevicePtr dst = Address(s.dst);
      DevicePtr src = 0;
      int64_t src_stride = row_bytes;
      if (staged_in_place_[i]) {
        // Mapped host memory has the same address on the device (GpuRuntime::MapHost).
        src = reinterpret_cast<uintptr_t>(s.src);
        src_stride = s.src_stride * 2;
        in_place_bytes_ += s.rows * row_bytes;
      } else {
        auto [at, host] = upload_.Reserve(s.rows * row_bytes);
        src = at;
        query_bytes_ += s.rows * row_bytes;
        if (host != nullptr && s.src_stride == s.width) {
          // A query's rows are one array on the wire: one copy, not one per head.
          std::memcpy(host, s.src, static_cast<size_t>(s.rows * row_bytes));
        } else if (host != nullptr) {
          for (int r = 0; r < s.rows; ++r) {
            std::memcpy(host + r * row_bytes, s.src + r * s.src_stride,
                        static_cast<size_t>(row_bytes));
          }
        }
      }
      const int rows_per_job = static_cast<int>(std::max<int64_t>(1, kCopyJobBytes / row_bytes));
      for (int r = 0; r < s.rows; r += rows_per_job) {
        jobs.push_back(CopyRowsJob{src + static_cast<DevicePtr>(r * src_stride),
                                   dst + static_cast<DevicePtr>(int64_t{r} * s.dst_stride * 2),
                                   src_stride, s.dst_stride * 2, std::min(rows_per_job, s.rows - r),
                                   static_cast<int32_t>(row_bytes)});
      }
      aligned = aligned && Aligned16(row_bytes) && Aligned16(static_cast<int64_t>(dst)) &&
                Aligned16(s.dst_stride * 2) && Aligned16(static_cast<int64_t>(src)) &&
                Aligned16(src_stride);
    }
    if (jobs.empty()) return;
    Launch launch{.kind = LaunchKind::kCopyRows, .name = "stage"};
    launch.tiles = upload_.PutArray(jobs);
    launch.count = static_cast<int32_t>(jobs.size());
    launch.aligned16 = aligned;
    AddLaunch(std::move(launch));
  }

  absl::Status EmitFills() {
    std::vector<FillJob> jobs;
    for (size_t i = 0; i < steps_.buffers.size(); ++i) {
      const StepBuffer& b = steps_.buffers[i];
      if (b.kind == StepBuffer::Kind::kInput || b.fill == StepBuffer::Fill::kNone) continue;
      if (b.fill == StepBuffer::Fill::kNegInfinity && b.type != ElementType::kFp32) {
        return absl::InternalError(
            absl::StrCat("buffer '", b.name, "': a -inf fill needs fp32 elements"));
      }
      const int64_t bytes = b.elements * ElementBytes(b.type);
      const uint32_t pattern = b.fill == StepBuffer::Fill::kZero ? kFillZero : kFillNegInfinity;
      // A job is a thread block: a large buffer is spread over many (split-KV's partial
      // outputs reach megabytes).
      const int64_t words = (bytes + 3) / 4;
      for (int64_t w = 0; w < words; w += kFillJobWords) {
        jobs.push_back(FillJob{base_[i] + static_cast<DevicePtr>(w * 4),
                               std::min(kFillJobWords, words - w), pattern});
      }
    }
    if (jobs.empty()) return absl::OkStatus();
    Launch launch{.kind = LaunchKind::kFill, .name = "fill"};
    launch.tiles = upload_.PutArray(jobs);
    launch.count = static_cast<int32_t>(jobs.size());
    AddLaunch(std::move(launch));
    return absl::OkStatus();
  }

  absl::Status EmitProjection(const ProjectionStep& step) {
    std::vector<GemmJob> jobs;
    std::vector<GemmTile> tiles;
    int32_t most_rows = 0;
    bool fits_row_kernel = true;
    for (const ProjectionJob& j : step.jobs) {
      // The GPU's GEMM reads the checkpoint's layout (the engine hands a GPU kv_b_proj as
      // loaded); the CPU matrix unit's tile layout is not one of its operand forms.
      if (j.b_tiles) {
        return absl::UnimplementedError(
            absl::StrCat("projection step '", step.name, "': B in the matrix unit's tile layout"));
      }
      const int32_t index = static_cast<int32_t>(jobs.size());
      GemmJob job;
      job.a = Address(j.a);
      job.b = Address(j.b);
      job.c = Address(j.c);
      job.lda = j.lda;
      job.ldb = j.ldb;
      job.ldc = j.ldc;
      job.rows = j.rows;
      job.n = j.n;
      job.k = j.k;
      job.transpose_b = j.transpose_b ? 1 : 0;
      job.c_bf16 = j.c_bf16 ? 1 : 0;
      jobs.push_back(job);
      most_rows = std::max(most_rows, j.rows);
      fits_row_kernel = fits_row_kernel && FitsRowKernel(job);
      for (int32_t r = 0; r < j.rows; r += kGemmTileRows) {
        for (int32_t c = 0; c < j.n; c += kGemmTileCols) tiles.push_back(GemmTile{index, r, c});
      }
    }
    if (tiles.empty()) return absl::OkStatus();
    Launch launch{.kind = LaunchKind::kGemm, .name = step.name};
    // The row kernel sums in another order than the tiled GEMM: a batch-invariant step stays
    // on the tiled one, whose rows do not depend on how many share a job.
    launch.gemv_rows = fits_row_kernel && !step.batch_invariant ? most_rows : 0;
    launch.records = upload_.PutArray(jobs);
    launch.tiles = upload_.PutArray(tiles);
    launch.count = static_cast<int32_t>(tiles.size());
    AddLaunch(std::move(launch));
    return absl::OkStatus();
  }

  // The keys of a row group in a tile's terms, and the block table it needs uploaded (only
  // the pages its visible keys span).
  void DescribeKeys(const AttentionRowGroup& g, int32_t length, AttentionTile& t) {
    const auto upload_pages = [&](std::span<const int32_t> pages, int32_t first_token,
                                  int page_size) {
      const int32_t first_page = first_token / page_size;
      const int32_t last_page = (first_token + length - 1) / page_size;
      t.pages = upload_.Put(pages.data() + first_page,
                            int64_t{last_page - first_page + 1} * sizeof(int32_t), 4);
      t.first_token = first_token - first_page * page_size;
      t.page_size = page_size;
    };
    if (const auto* paged = std::get_if<PagedKeysRef>(&g.keys)) {
      t.kind = KeysKind::kPagedBf16;
      t.base = Address(paged->pool);
      t.row_stride = int64_t{paged->width} * 2;
      t.page_stride = t.row_stride * paged->page_size;
      upload_pages(paged->pages, paged->first_token, paged->page_size);
    } else if (const auto* fp8 = std::get_if<Fp8PagedKeysRef>(&g.keys)) {
      t.kind = KeysKind::kPagedFp8;
      t.base = Address(fp8->pool);
      t.page_stride = fp8->layout.stride();
      t.fp8_scale_offset = fp8->layout.scale_offset(0);
      t.fp8_rope_offset = fp8->layout.rope_offset(0);
      upload_pages(fp8->pages, fp8->first_token, fp8->layout.page_size);
    } else {
      const auto& dense = std::get<DenseKeysRef>(g.keys);
      t.kind = KeysKind::kDense;
      t.base = Address(dense.k);
      t.values = Address(dense.v);
      t.ldk = dense.ldk;
      t.ldv = dense.ldv;
    }
  }

  // The bf16 pool every paged tile of a launch reads, as whole blocks of key rows, or
  // nothing (rows 0) once one tile's keys do not start on a block of its page or another
  // pool shows up.
  struct BlockPool {
    bool seen = false;
    bool whole_blocks = true;
    DevicePtr base = 0;
    int64_t rows = 0;
    int64_t row_stride = 0;

    void Add(DevicePtr tile_base, int64_t pool_rows, int64_t stride, bool on_blocks) {
      whole_blocks = whole_blocks && on_blocks &&
                     (!seen || (tile_base == base && pool_rows == rows && stride == row_stride));
      seen = true;
      base = tile_base;
      rows = pool_rows;
      row_stride = stride;
    }
  };

  void EmitAttention(const AttentionStep& step) {
    std::map<KeysKind, std::vector<AttentionTile>> tiles;
    BlockPool block_pool;
    for (const AttentionRowGroup& g : step.groups) {
      const int32_t length = *std::max_element(g.visible.begin(), g.visible.end());
      if (length == 0) continue;  // the destinations' fill stands, as on the host
      AttentionTile group_tile;
      DescribeKeys(g, length, group_tile);
      if (const auto* paged = std::get_if<PagedKeysRef>(&g.keys)) {
        const StepBuffer& pool = steps_.buffers[paged->pool.buffer];
        const int64_t rows = (pool.elements - paged->pool.offset) / paged->width;
        block_pool.Add(group_tile.base, rows, group_tile.row_stride,
                       paged->page_size % kAttentionBlockKeys == 0 &&
                           group_tile.first_token % kAttentionBlockKeys == 0);
      }
      const DevicePtr visible = upload_.Put(g.visible.data(), int64_t{g.rows} * 4, 4);
      const int64_t out_bytes = g.out_bf16 ? 2 : 4;
      for (int32_t r0 = 0; r0 < g.rows; r0 += kAttentionTileRows) {
        AttentionTile t = group_tile;
        t.rows = std::min(kAttentionTileRows, g.rows - r0);
        t.keys = *std::max_element(g.visible.begin() + r0, g.visible.begin() + r0 + t.rows);
        t.q = Address(g.q) + static_cast<DevicePtr>(int64_t{r0} * step.dk * 2);
        t.visible = visible + static_cast<DevicePtr>(int64_t{r0} * 4);
        t.out = Address(g.out) + static_cast<DevicePtr>(r0 * g.out_stride * out_bytes);
        t.out_stride = g.out_stride;
        t.out_bf16 = g.out_bf16 ? 1 : 0;
        t.lse = Address(g.lse) + static_cast<DevicePtr>(r0 * g.lse_stride * 4);
        t.lse_stride = g.lse_stride;
        tiles[t.kind].push_back(t);
      }
      // Dense tiles come in pairs of one row group (gpu_jobs.h), the second empty if need be.
      if (group_tile.kind == KeysKind::kDense && tiles[KeysKind::kDense].size() % 2 == 1) {
        AttentionTile empty = tiles[KeysKind::kDense].back();
        empty.rows = 0;
        empty.keys = 0;
        tiles[KeysKind::kDense].push_back(empty);
      }
    }
    for (const auto& [kind, list] : tiles) {
      Launch launch{.kind = LaunchKind::kAttention, .name = step.name};
      launch.tiles = upload_.PutArray(list);
      launch.count = static_cast<int32_t>(list.size());
      launch.keys = kind;
      launch.dk = step.dk;
      launch.dv = step.dv;
      launch.softmax_scale = step.softmax_scale;
      for (const AttentionTile& t : list) {
        launch.max_tile_rows = std::max(launch.max_tile_rows, t.rows);
      }
      if (kind == KeysKind::kPagedBf16 && block_pool.whole_blocks) {
        launch.key_pool = block_pool.base;
        launch.key_pool_rows = block_pool.rows;
        launch.key_row_stride = block_pool.row_stride;
      }
      AddLaunch(std::move(launch));
    }
  }

  absl::Status EmitCombine(const CombineStep& step) {
    std::vector<CombineJob> jobs;
    std::vector<CombineTile> tiles;
    for (const mlaserve::CombineJob& j : step.jobs) {
      if (j.dv > kCombineMaxDv) {
        return absl::InternalError(absl::StrCat("combine '", step.name, "': rows of ", j.dv,
                                                " values, more than ", kCombineMaxDv));
      }
      std::vector<CombinePart> parts;
      for (const auto& p : j.parts) parts.push_back(CombinePart{Address(p.out), Address(p.lse)});
      // The kernel reads the parts' rows as 16-byte vectors.
      const bool vectors =
          j.dv > 0 && j.dv % 4 == 0 && std::all_of(parts.begin(), parts.end(), [](auto& p) {
            return Aligned16(static_cast<int64_t>(p.out));
          });
      if (!vectors) {
        return absl::InternalError(absl::StrCat("combine '", step.name, "': rows of ", j.dv,
                                                " values or parts not 16-byte aligned"));
      }
      CombineJob job;
      job.parts = upload_.PutArray(parts);
      job.out = Address(j.out);
      job.lse = Address(j.lse);
      job.out_stride = j.out_stride;
      job.lse_stride = j.lse_stride;
      job.num_parts = static_cast<int32_t>(parts.size());
      job.rows = j.rows;
      job.dv = j.dv;
      job.out_bf16 = j.out_bf16 ? 1 : 0;
      const int32_t index = static_cast<int32_t>(jobs.size());
      jobs.push_back(job);
      const bool in_place = std::any_of(
          parts.begin(), parts.end(), [&](const CombinePart& part) { return part.lse == job.lse; });
      const int32_t slice = in_place ? job.dv : std::min(job.dv, kCombineSliceColumns);
      for (int32_t r = 0; r < j.rows; r += kCombineTileRows) {
        for (int32_t c = 0; c < job.dv; c += slice) {
          tiles.push_back(CombineTile{index, r, c, std::min(slice, job.dv - c)});
        }
      }
    }
    if (tiles.empty()) return absl::OkStatus();
    Launch launch{.kind = LaunchKind::kCombine, .name = step.name};
    launch.records = upload_.PutArray(jobs);
    launch.tiles = upload_.PutArray(tiles);
    launch.count = static_cast<int32_t>(tiles.size());
    AddLaunch(std::move(launch));
    return absl::OkStatus();
  }

  const BatchSteps& steps_;
  std::span<const UploadCopy> copies_;
  const std::vector<bool>& staged_in_place_;
  const InputResolver* resolve_;
  UploadWriter upload_;
  std::vector<DevicePtr> base_;  // per buffer
  std::vector<Launch> launches_;
  int64_t query_bytes_ = 0;
  int64_t in_place_bytes_ = 0;
  int64_t copied_bytes_ = 0;
};

}  // namespace

const char* LaunchKindName(LaunchKind kind) {
  switch (kind) {
    case LaunchKind::kCopyRows:
      return "copy_rows";
    case LaunchKind::kFill:
      return "fill";
    case LaunchKind::kGemm:
      return "gemm";
    case LaunchKind::kAttention:
      return "attention";
    case LaunchKind::kCombine:
      return "combine";
  }
  return "?";
}

void UseGpuSplit(DecodeBatch& batch, const DeviceProperties& device) {
  batch.unit_rows = kAttentionTileRows;
  batch.dense_unit_rows = device.dense_unit_rows;
  batch.split_block_tokens = kAttentionBlockKeys;
  batch.balance_waves = true;
  batch.split_part_overhead_blocks = kAttentionPartOverheadBlocks;
}

absl::StatusOr<BatchLayout> LayOutBatch(const BatchSteps& steps, std::span<const UploadCopy> copies,
                                        const HostReadable& in_place, int64_t in_place_min_bytes) {
  RETURN_IF_ERROR(ValidateBatchSteps(steps));
  RETURN_IF_ERROR(CheckExecutable(steps));
  for (const UploadCopy& c : copies) {
    if (c.bytes <= 0 || c.bytes > std::numeric_limits<int32_t>::max() || c.src == nullptr) {
      return absl::InternalError(absl::StrCat("upload copy of ", c.bytes, " bytes"));
    }
  }
  BatchLayout layout;
  layout.buffer_offsets.assign(steps.buffers.size(), -1);
  int64_t at = 0;
  // Answers first (one download), then scratch.
  for (StepBuffer::Kind kind : {StepBuffer::Kind::kOutput, StepBuffer::Kind::kScratch}) {
    for (size_t i = 0; i < steps.buffers.size(); ++i) {
      const StepBuffer& b = steps.buffers[i];
      if (b.kind != kind) continue;
      layout.buffer_offsets[i] = at;
      at = AlignUp(at + std::max<int64_t>(b.elements * ElementBytes(b.type), 1), kBufferAlignment);
    }
    if (kind == StepBuffer::Kind::kOutput) layout.download_bytes = at;
  }
  layout.upload_offset = at;
  layout.staged_in_place.assign(steps.staging.size(), false);
  if (in_place) {
    int64_t readable = 0;
    for (size_t i = 0; i < steps.staging.size(); ++i) {
      const StageCopy& s = steps.staging[i];
      const int64_t span = (int64_t{s.rows} - 1) * s.src_stride * 2 + int64_t{s.width} * 2;
      layout.staged_in_place[i] = s.rows > 0 && in_place(s.src, span);
      if (layout.staged_in_place[i]) readable += int64_t{s.rows} * s.width * 2;
    }
    if (readable < in_place_min_bytes) layout.staged_in_place.assign(steps.staging.size(), false);
  }
  Lowerer counter(steps, copies, layout, 0, nullptr, nullptr);
  RETURN_IF_ERROR(counter.Run());
  layout.upload_bytes = counter.upload_bytes();
  layout.arena_bytes = AlignUp(at + layout.upload_bytes, kBufferAlignment);
  return layout;
}

absl::StatusOr<Program> LowerBatch(const BatchSteps& steps, const BatchLayout& layout,
                                   DevicePtr arena, const InputResolver& resolve,
                                   std::span<std::byte> upload,
                                   std::span<const UploadCopy> copies) {
  if (static_cast<int64_t>(upload.size()) < layout.upload_bytes ||
      layout.buffer_offsets.size() != steps.buffers.size() ||
      layout.staged_in_place.size() != steps.staging.size()) {
    return absl::InternalError("gpu lowering: the layout is not this batch's");
  }
  Lowerer lowerer(steps, copies, layout, arena, &resolve, upload.data());
  RETURN_IF_ERROR(lowerer.Run());
  if (lowerer.upload_bytes() != layout.upload_bytes) {
    return absl::InternalError("gpu lowering: the upload differs from its layout");
  }
  Program program;
  program.upload_to = arena + static_cast<DevicePtr>(layout.upload_offset);
  program.upload_bytes = layout.upload_bytes;
  program.launches = std::move(lowerer.launches());
  program.download_from = arena;
  program.download_bytes = layout.download_bytes;
  program.query_bytes = lowerer.query_bytes();
  program.copied_bytes = lowerer.copied_bytes();
  program.in_place_bytes = lowerer.in_place_bytes();
  return program;
}

}  // namespace mlaserve::gpu
