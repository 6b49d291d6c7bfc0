#include "kernels/gpu/fake_gpu_runtime.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/attention_rows.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/kv_block_source.h"
#include "kernels/core/matmul.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/lse_combine.h"
#include "kernels/mla/row_attention.h"
#include "kernels/mla/snap_amla.h"

namespace mlaserve::gpu {
namespace {

constexpr int64_t kAllocationAlignment = 256;

template <typename T>
T* As(std::byte* p) {
  return reinterpret_cast<T*>(p);
}

// The fake's device addresses are host addresses.
template <typename T>
const T* At(DevicePtr p) {
  return reinterpret_cast<const T*>(static_cast<uintptr_t>(p));
}

void StoreRow(const float* row, int n, std::byte* dst, bool to_bf16) {
  if (to_bf16) {
    NarrowToBf16(row, n, As<Bf16>(dst));
  } else {
    std::memcpy(dst, row, static_cast<size_t>(n) * sizeof(float));
  }
}

}  // namespace

FakeGpuRuntime::FakeGpuRuntime(Options options) : capacity_(options.memory_bytes) {
  properties_.name = "fake GPU (host memory, host kernels)";
  properties_.sm_count = options.sm_count;
  properties_.total_memory = options.memory_bytes;
  properties_.driver = "none";
  properties_.bf16_tflops = options.bf16_tflops;
  properties_.hbm_tbps = options.hbm_tbps;
}

FakeGpuRuntime::~FakeGpuRuntime() {
  for (const auto& [ptr, allocation] : allocations_) {
    std::free(reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)));
  }
}

absl::StatusOr<MemoryInfo> FakeGpuRuntime::Memory() {
  RETURN_IF_ERROR(health());
  return MemoryInfo{capacity_ - allocated_, capacity_};
}

absl::StatusOr<DevicePtr> FakeGpuRuntime::Allocate(int64_t bytes, absl::string_view what) {
  RETURN_IF_ERROR(health());
  if (bytes <= 0) return absl::InternalError(absl::StrCat("allocating ", bytes, " bytes"));
  const int64_t rounded =
      (bytes + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
  if (allocated_ + rounded > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat("device memory: ", what, " needs ", bytes,
                                                     " bytes, ", capacity_ - allocated_,
                                                     " free of ", capacity_));
  }
  void* p = std::aligned_alloc(kAllocationAlignment, static_cast<size_t>(rounded));
  if (p == nullptr) return absl::ResourceExhaustedError("host memory for the fake device");
  // Device memory starts undefined: poison it so a read of memory nothing wrote shows.
  std::memset(p, 0xff, static_cast<size_t>(rounded));
  const DevicePtr ptr = reinterpret_cast<uintptr_t>(p);
  allocations_[ptr] = Allocation{rounded, std::string(what)};
  allocated_ += rounded;
  return ptr;
}

void FakeGpuRuntime::Free(DevicePtr ptr) {
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) return;
  allocated_ -= it->second.bytes;
  std::free(reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)));
  allocations_.erase(it);
}

absl::StatusOr<HostBuffer> FakeGpuRuntime::AllocateHost(int64_t bytes) {
  largest_host_allocation_ = std::max(largest_host_allocation_, bytes);
  std::shared_ptr<std::byte[]> memory(
      new std::byte[static_cast<size_t>(std::max<int64_t>(bytes, 1))]);
  return HostBuffer{memory.get(), bytes, memory};
}

absl::StatusOr<std::shared_ptr<void>> FakeGpuRuntime::MapHost(const void* data, int64_t bytes) {
  RETURN_IF_ERROR(health());
  if (data == nullptr || bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("mapping ", bytes, " host bytes"));
  }
  return mapped_->Add(data, bytes, [] {});
}

bool FakeGpuRuntime::ReadsInPlace(const void* data, int64_t bytes) const {
  return mapped_->Contains(data, bytes);
}

absl::StatusOr<std::byte*> FakeGpuRuntime::Span(DevicePtr ptr, int64_t bytes,
                                                absl::string_view what) const {
  if (bytes == 0) return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(ptr));
  auto it = allocations_.upper_bound(ptr);
  if (it != allocations_.begin()) {
    --it;
    const DevicePtr begin = it->first;
    if (bytes > 0 && ptr >= begin &&
        ptr + static_cast<DevicePtr>(bytes) <= begin + static_cast<DevicePtr>(it->second.bytes)) {
      return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(ptr));
    }
  }
  const void* host = reinterpret_cast<const void*>(static_cast<uintptr_t>(ptr));
  if (bytes > 0 && mapped_->Contains(host, bytes)) {
    return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(ptr));
  }
  return absl::InternalError(
      absl::StrCat(what, ": ", bytes, " bytes at ", ptr, " are outside device memory"));
}

absl::Status FakeGpuRuntime::CopyToDevice(DevicePtr dst, const void* src, int64_t bytes) {
  RETURN_IF_ERROR(health());
  ASSIGN_OR_RETURN(std::byte * to, Span(dst, bytes, "copy to device"));
  std::memcpy(to, src, static_cast<size_t>(bytes));
  bytes_to_device_ += bytes;
  return absl::OkStatus();
}

absl::Status FakeGpuRuntime::CopyToHost(void* dst, DevicePtr src, int64_t bytes) {
  RETURN_IF_ERROR(health());
  ASSIGN_OR_RETURN(std::byte * from, Span(src, bytes, "copy to host"));
  std::memcpy(dst, from, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status FakeGpuRuntime::health() const {
  std::lock_guard lock(fault_mu_);
  return fault_;
}

void FakeGpuRuntime::InjectFault(std::string reason, int runs_before) {
  pending_fault_ = std::move(reason);
  runs_before_fault_ = runs_before;
}

absl::StatusOr<ProgramTiming> FakeGpuRuntime::Run(const Program& program, const ProgramIo& io) {
  RETURN_IF_ERROR(health());
  if (runs_before_fault_ == 0) {
    std::lock_guard lock(fault_mu_);
    fault_ = absl::UnavailableError(absl::StrCat("device fault: ", pending_fault_));
    return fault_;
  }
  if (runs_before_fault_ > 0) --runs_before_fault_;
  if (static_cast<int64_t>(io.upload.size()) < program.upload_bytes ||
      static_cast<int64_t>(io.download.size()) < program.download_bytes) {
    return absl::InternalError("program: host buffers smaller than its copies");
  }
  if (program.upload_bytes > 0) {
    RETURN_IF_ERROR(CopyToDevice(program.upload_to, io.upload.data(), program.upload_bytes));
  }
  const auto start = std::chrono::steady_clock::now();
  for (const Launch& launch : program.launches) {
    if (absl::Status s = Execute(launch); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(LaunchKindName(launch.kind), " launch '",
                                                 launch.name, "': ", s.message()));
    }
  }
  if (program.download_bytes > 0) {
    RETURN_IF_ERROR(CopyToHost(io.download.data(), program.download_from, program.download_bytes));
  }
  ++programs_run_;
  // The fake's "device time" is the host's time executing the launches.
  ProgramTiming timing;
  timing.kernels_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return timing;
}

absl::Status FakeGpuRuntime::Execute(const Launch& launch) {
  const auto records = [&](DevicePtr at, int64_t count, int64_t size) {
    return Span(at, count * size, "records");
  };
  switch (launch.kind) {
    case LaunchKind::kCopyRows: {
      ASSIGN_OR_RETURN(std::byte * raw, records(launch.tiles, launch.count, sizeof(CopyRowsJob)));
      for (const CopyRowsJob& j : std::span(As<CopyRowsJob>(raw), launch.count)) {
        if (launch.aligned16 && ((j.src | j.dst) % 16 != 0 || j.src_stride % 16 != 0 ||
                                 j.dst_stride % 16 != 0 || j.row_bytes % 16 != 0)) {
          return absl::InternalError("a copy marked 16-byte aligned is not");
        }
        for (int32_t r = 0; r < j.rows; ++r) {
          ASSIGN_OR_RETURN(std::byte * from, Span(j.src + r * j.src_stride, j.row_bytes, "src"));
          ASSIGN_OR_RETURN(std::byte * to, Span(j.dst + r * j.dst_stride, j.row_bytes, "dst"));
          std::memmove(to, from, static_cast<size_t>(j.row_bytes));
        }
      }
      return absl::OkStatus();
    }
    case LaunchKind::kFill: {
      ASSIGN_OR_RETURN(std::byte * raw, records(launch.tiles, launch.count, sizeof(FillJob)));
      for (const FillJob& j : std::span(As<FillJob>(raw), launch.count)) {
        ASSIGN_OR_RETURN(std::byte * to, Span(j.dst, j.words * 4, "fill"));
        std::fill_n(As<uint32_t>(to), j.words, j.pattern);
      }
      return absl::OkStatus();
    }
    case LaunchKind::kGemm: {
      ASSIGN_OR_RETURN(std::byte * tiles, records(launch.tiles, launch.count, sizeof(GemmTile)));
      for (const GemmTile& t : std::span(As<GemmTile>(tiles), launch.count)) {
        ASSIGN_OR_RETURN(std::byte * raw,
                         records(launch.records + t.job * sizeof(GemmJob), 1, sizeof(GemmJob)));
        const GemmJob& j = *As<GemmJob>(raw);
        const int m = std::min(kGemmTileRows, j.rows - t.row0);
        const int n = std::min(kGemmTileCols, j.n - t.col0);
        const int64_t a_extent = (int64_t{m} - 1) * j.lda + j.k;
        const int64_t b_extent =
            j.transpose_b ? (int64_t{n} - 1) * j.ldb + j.k : (int64_t{j.k} - 1) * j.ldb + n;
        ASSIGN_OR_RETURN(std::byte * a, Span(j.a + t.row0 * j.lda * 2, a_extent * 2, "A"));
        const int64_t b_first = j.transpose_b ? int64_t{t.col0} * j.ldb : t.col0;
        ASSIGN_OR_RETURN(std::byte * b, Span(j.b + b_first * 2, b_extent * 2, "B"));
        const int64_t c_bytes = j.c_bf16 ? 2 : 4;
        const int64_t c_extent = (int64_t{m} - 1) * j.ldc + n;
        ASSIGN_OR_RETURN(std::byte * c,
                         Span(j.c + (t.row0 * j.ldc + t.col0) * c_bytes, c_extent * c_bytes, "C"));
        // A GPU's tiled GEMM computes each row of a tile alike, whatever rows share it; the
        // host's matrix path does not (its few-row kernel sums in another order), so the
        // tile is multiplied row by row, and a row's bits never depend on its neighbours.
        std::vector<float> tile(static_cast<size_t>(m) * n);
        for (int r = 0; r < m; ++r) {
          MatmulBf16(j.transpose_b != 0, 1, n, j.k, As<const Bf16>(a) + r * j.lda, j.lda,
                     As<const Bf16>(b), j.ldb, tile.data() + r * n, n, /*accumulate=*/false,
                     kProjectionDepthChunk);
        }
        if (j.row_scale != 0) {
          ASSIGN_OR_RETURN(std::byte * s, Span(j.row_scale + t.row0 * 4, int64_t{m} * 4, "scale"));
          for (int r = 0; r < m; ++r) {
            for (int col = 0; col < n; ++col) tile[r * n + col] *= As<const float>(s)[r];
          }
        }
        for (int r = 0; r < m; ++r) {
          StoreRow(tile.data() + r * n, n, c + r * j.ldc * c_bytes, j.c_bf16 != 0);
        }
      }
      return absl::OkStatus();
    }
    case LaunchKind::kAttention: {
      ASSIGN_OR_RETURN(std::byte * raw, records(launch.tiles, launch.count, sizeof(AttentionTile)));
      const int dk = launch.dk, dv = launch.dv;
      for (const AttentionTile& t : std::span(As<AttentionTile>(raw), launch.count)) {
        if (t.kind != launch.keys) return absl::InternalError("a tile of another kind of keys");
        if (t.rows == 0 && t.kind == KeysKind::kDense) continue;  // a pair's empty second
        if (t.rows <= 0 || t.rows > kAttentionTileRows) return absl::InternalError("tile rows");
        ASSIGN_OR_RETURN(std::byte * q_raw, Span(t.q, int64_t{t.rows} * dk * 2, "q"));
        ASSIGN_OR_RETURN(std::byte * visible_raw, Span(t.visible, int64_t{t.rows} * 4, "visible"));
        std::vector<float> q(static_cast<size_t>(t.rows) * dk);
        WidenBf16(As<const Bf16>(q_raw), static_cast<int64_t>(q.size()), q.data());
        const std::span<const int32_t> visible(As<const int32_t>(visible_raw), t.rows);
        for (int32_t v : visible) {
          if (v < 0 || v > t.keys)
            return absl::InternalError("a row sees more than the tile's keys");
        }
        std::vector<float> out(static_cast<size_t>(t.rows) * dv);
        std::vector<float> lse(t.rows);
        const QueryRows rows{q.data(), dk, t.rows, dk, visible};
        const RowOutputs outputs{out.data(), dv, lse.data()};
        if (t.kind == KeysKind::kDense) {
          ASSIGN_OR_RETURN(std::byte * k,
                           Span(t.base, (int64_t{t.keys} - 1) * t.ldk * 2 + dk * 2, "K"));
          ASSIGN_OR_RETURN(std::byte * v,
                           Span(t.values, (int64_t{t.keys} - 1) * t.ldv * 2 + dv * 2, "V"));
          DenseKvSource source(As<const Bf16>(k), t.ldk, dk, As<const Bf16>(v), t.ldv, dv, t.keys);
          RunRowAttention(RescaleAlgorithm::kAmla, rows, source, launch.softmax_scale, outputs);
        } else {
          const int32_t pages = (t.first_token + t.keys - 1) / t.page_size + 1;
          ASSIGN_OR_RETURN(std::byte * table_raw, Span(t.pages, int64_t{pages} * 4, "pages"));
          const std::span<const int32_t> table(As<const int32_t>(table_raw), pages);
          int32_t max_page = 0;
          for (int32_t p : table) {
            if (p < 0) return absl::InternalError("a negative page id");
            max_page = std::max(max_page, p);
            ASSIGN_OR_RETURN(std::byte * page,
                             Span(t.base + p * t.page_stride, t.page_stride, "page"));
            (void)page;
          }
          if (t.kind == KeysKind::kPagedBf16) {
            const int width = static_cast<int>(t.row_stride / 2);
            if (t.page_stride != t.row_stride * t.page_size || width < dk) {
              return absl::InternalError("bf16 page geometry");
            }
            const int64_t elements = (int64_t{max_page} + 1) * t.page_size * width;
            const PagedKvCache cache{*TensorView<const Bf16, 3>::Create(
                std::span<const Bf16>(At<Bf16>(t.base), static_cast<size_t>(elements)),
                {max_page + 1, t.page_size, width}, "pool")};
            const int32_t seqlen = t.first_token + t.keys;
            const PagedSequences sequences{
                *TensorView<const int32_t, 2>::Create(table, {1, pages}, "pages"),
                std::span<const int32_t>(&seqlen, 1)};
            PagedLatentSource source(cache, sequences, 0, dv, t.first_token);
            RunRowAttention(RescaleAlgorithm::kAmla, rows, source, launch.softmax_scale, outputs);
          } else {
            Fp8PageLayout layout{t.page_size, dv, dk - dv, t.page_stride};
            if (layout.scale_offset(0) != t.fp8_scale_offset ||
                layout.rope_offset(0) != t.fp8_rope_offset ||
                layout.stride() < layout.page_bytes()) {
              return absl::InternalError("FP8 page geometry");
            }
            const Fp8SequenceKeys keys{Fp8PagedKvCache{At<std::byte>(t.base), max_page + 1, layout},
                                       table, t.first_token, t.keys};
            // The GPU multiplies bf16 (the e4m3 content widens exactly): a bf16 query is exact
            // there, as on a matrix unit without an FP8 rate (SnapAmlaOptions).
            SnapAmlaRows(rows, keys, launch.softmax_scale,
                         SnapAmlaOptions{.quantize_queries = false}, outputs);
          }
        }
        const int64_t out_bytes = t.out_bf16 ? 2 : 4;
        ASSIGN_OR_RETURN(
            std::byte * o,
            Span(t.out, ((int64_t{t.rows} - 1) * t.out_stride + dv) * out_bytes, "out"));
        ASSIGN_OR_RETURN(std::byte * l,
                         Span(t.lse, ((int64_t{t.rows} - 1) * t.lse_stride + 1) * 4, "lse"));
        for (int r = 0; r < t.rows; ++r) {
          StoreRow(out.data() + int64_t{r} * dv, dv, o + r * t.out_stride * out_bytes,
                   t.out_bf16 != 0);
          As<float>(l)[r * t.lse_stride] = lse[r];
        }
      }
      return absl::OkStatus();
    }
    case LaunchKind::kCombine: {
      ASSIGN_OR_RETURN(std::byte * tiles, records(launch.tiles, launch.count, sizeof(CombineTile)));
      for (const CombineTile& t : std::span(As<CombineTile>(tiles), launch.count)) {
        ASSIGN_OR_RETURN(std::byte * raw, records(launch.records + t.job * sizeof(CombineJob), 1,
                                                  sizeof(CombineJob)));
        const CombineJob& j = *As<CombineJob>(raw);
        ASSIGN_OR_RETURN(std::byte * parts_raw, records(j.parts, j.num_parts, sizeof(CombinePart)));
        const std::span<const CombinePart> parts(As<const CombinePart>(parts_raw), j.num_parts);
        std::vector<const float*> outs(j.num_parts);
        std::vector<float> lses(j.num_parts);
        std::vector<float> slice(t.cols);
        const int64_t out_bytes = j.out_bf16 ? 2 : 4;
        for (int r = t.row0; r < std::min(j.rows, t.row0 + kCombineTileRows); ++r) {
          // The tile's columns only: the merge is column by column (CombineLseParts).
          for (int p = 0; p < j.num_parts; ++p) {
            ASSIGN_OR_RETURN(std::byte * o, Span(parts[p].out + (int64_t{r} * j.dv + t.col0) * 4,
                                                 int64_t{t.cols} * 4, "part"));
            ASSIGN_OR_RETURN(std::byte * l, Span(parts[p].lse + int64_t{r} * 4, 4, "part lse"));
            outs[p] = As<const float>(o);
            lses[p] = *As<const float>(l);
          }
          float lse = 0;
          CombineLseParts(j.num_parts, outs.data(), lses.data(), t.cols, slice.data(), &lse);
          ASSIGN_OR_RETURN(std::byte * o, Span(j.out + (r * j.out_stride + t.col0) * out_bytes,
                                               int64_t{t.cols} * out_bytes, "out"));
          StoreRow(slice.data(), t.cols, o, j.out_bf16 != 0);
          if (t.col0 == 0) {
            ASSIGN_OR_RETURN(std::byte * l, Span(j.lse + r * j.lse_stride * 4, 4, "lse"));
            *As<float>(l) = lse;
          }
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown launch kind");
}

}  // namespace mlaserve::gpu
