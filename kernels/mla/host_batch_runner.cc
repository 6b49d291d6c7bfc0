#include "kernels/mla/host_batch_runner.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/kv_block_source.h"
#include "kernels/core/matmul.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/core/tiling.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/lse_combine.h"
#include "kernels/mla/row_attention.h"
#include "kernels/mla/snap_amla.h"

namespace mlaserve {
namespace {

// The batch's memory on the host: inputs in place, every other buffer owned.
class HostBuffers final : public BatchBuffers {
 public:
  explicit HostBuffers(const BatchSteps& steps)
      : buffers_(steps.buffers.size()), owned_(steps.buffers.size()) {
    for (size_t i = 0; i < steps.buffers.size(); ++i) {
      const StepBuffer& b = steps.buffers[i];
      const size_t bytes = static_cast<size_t>(b.elements * ElementBytes(b.type));
      if (b.kind == StepBuffer::Kind::kInput) {
        buffers_[i] = {static_cast<std::byte*>(const_cast<void*>(b.input)), bytes};
        continue;
      }
      owned_[i].reset(new std::byte[std::max<size_t>(bytes, 1)]);
      buffers_[i] = {owned_[i].get(), bytes};
      FillStepBuffer(b.fill, owned_[i].get(), static_cast<int64_t>(bytes));
    }
  }

  std::span<const std::byte> Bytes(int buffer) const override { return buffers_[buffer]; }

  template <typename T>
  T* At(BufferRef ref) const {
    return reinterpret_cast<T*>(buffers_[ref.buffer].data()) + ref.offset;
  }

 private:
  std::vector<std::span<std::byte>> buffers_;
  std::vector<std::unique_ptr<std::byte[]>> owned_;
};

// An fp32 row written to its destination, rounded to bf16 (nearest even) if asked.
void StoreRow(const float* row, int n, std::byte* dst, bool to_bf16) {
  if (to_bf16) {
    NarrowToBf16(row, n, reinterpret_cast<Bf16*>(dst));
  } else {
    std::memcpy(dst, row, static_cast<size_t>(n) * sizeof(float));
  }
}

std::byte* RowAddress(const HostBuffers& b, BufferRef ref, int64_t row, int64_t stride, bool bf16) {
  return reinterpret_cast<std::byte*>(b.At<char>(BufferRef{ref.buffer, 0})) +
         (ref.offset + row * stride) * (bf16 ? 2 : 4);
}

void RunProjection(const HostBuffers& b, const ProjectionJob& j) {
  const Bf16* a = b.At<const Bf16>(j.a);
  const Bf16* w = b.At<const Bf16>(j.b);
  const auto multiply = [&](float* c, int64_t ldc) {
    if (j.b_tiles) {
      MatmulBf16Tiled(j.transpose_b, j.rows, j.n, j.k, a, j.lda, w, c, ldc, /*accumulate=*/false);
    } else {
      MatmulBf16(j.transpose_b, j.rows, j.n, j.k, a, j.lda, w, j.ldb, c, ldc,
                 /*accumulate=*/false, kProjectionDepthChunk);
    }
  };
  if (!j.c_bf16) {
    multiply(b.At<float>(j.c), j.ldc);
    return;
  }
  std::vector<float> c(static_cast<size_t>(j.rows) * j.n);
  multiply(c.data(), j.n);
  for (int r = 0; r < j.rows; ++r) {
    StoreRow(c.data() + static_cast<int64_t>(r) * j.n, j.n, RowAddress(b, j.c, r, j.ldc, true),
             true);
  }
}

void RunRowGroup(const HostBuffers& b, const AttentionStep& step, const AttentionRowGroup& g) {
  const int length = *std::max_element(g.visible.begin(), g.visible.end());
  // No key for any row: the kernel's early exit, as on the device; the destinations' fill
  // (output 0, lse -inf) stands.
  if (length == 0) return;
  std::vector<float> q(static_cast<size_t>(g.rows) * step.dk);
  WidenBf16(b.At<const Bf16>(g.q), static_cast<int64_t>(g.rows) * step.dk, q.data());
  std::vector<float> out(static_cast<size_t>(g.rows) * step.dv);
  std::vector<float> lse(g.rows);
  const QueryRows rows{q.data(), step.dk, g.rows, step.dk, g.visible};
  const RowOutputs outputs{out.data(), step.dv, lse.data()};
  if (const auto* paged = std::get_if<PagedKeysRef>(&g.keys)) {
    const int64_t page_elements = int64_t{paged->page_size} * paged->width;
    const int64_t pages =
        static_cast<int64_t>(b.Bytes(paged->pool.buffer).size() / 2 - paged->pool.offset) /
        page_elements;
    const PagedKvCache cache{*TensorView<const Bf16, 3>::Create(
        std::span<const Bf16>(b.At<const Bf16>(paged->pool), pages * page_elements),
        {pages, paged->page_size, paged->width}, "pool")};
    const int32_t seqlen = paged->first_token + length;
    const PagedSequences table{
        *TensorView<const int32_t, 2>::Create(
            paged->pages, {1, static_cast<int64_t>(paged->pages.size())}, "pages"),
        std::span<const int32_t>(&seqlen, 1)};
    PagedLatentSource source(cache, table, 0, step.dv, paged->first_token);
    RunRowAttention(step.algorithm, rows, source, step.softmax_scale, outputs);
  } else if (const auto* fp8 = std::get_if<Fp8PagedKeysRef>(&g.keys)) {
    const int64_t pages =
        static_cast<int64_t>(b.Bytes(fp8->pool.buffer).size() - fp8->pool.offset) /
        fp8->layout.stride();
    const Fp8SequenceKeys keys{
        Fp8PagedKvCache{b.At<const std::byte>(fp8->pool), pages, fp8->layout}, fp8->pages,
        fp8->first_token, length};
    SnapAmlaRows(rows, keys, step.softmax_scale,
                 SnapAmlaOptions{.quantize_queries = step.fp8_quantize_queries}, outputs);
  } else {
    const auto& dense = std::get<DenseKeysRef>(g.keys);
    DenseKvSource source(b.At<const Bf16>(dense.k), dense.ldk, step.dk, b.At<const Bf16>(dense.v),
                         dense.ldv, step.dv, length);
    RunRowAttention(step.algorithm, rows, source, step.softmax_scale, outputs);
  }
  for (int r = 0; r < g.rows; ++r) {
    StoreRow(out.data() + static_cast<int64_t>(r) * step.dv, step.dv,
             RowAddress(b, g.out, r, g.out_stride, g.out_bf16), g.out_bf16);
    b.At<float>(g.lse)[r * g.lse_stride] = lse[r];
  }
}

// Rows [first, last) of a merge.
constexpr int kCombineSliceRows = 16;

void RunCombine(const HostBuffers& b, const CombineJob& j, int first, int last) {
  const int parts = static_cast<int>(j.parts.size());
  std::vector<const float*> outs(parts);
  std::vector<float> lses(parts);
  std::vector<float> row(j.dv);
  for (int r = first; r < last; ++r) {
    for (int p = 0; p < parts; ++p) {
      outs[p] = b.At<const float>(j.parts[p].out) + static_cast<int64_t>(r) * j.dv;
      lses[p] = b.At<const float>(j.parts[p].lse)[r];
    }
    float lse = 0;
    CombineLseParts(parts, outs.data(), lses.data(), j.dv, row.data(), &lse);
    StoreRow(row.data(), j.dv, RowAddress(b, j.out, r, j.out_stride, j.out_bf16), j.out_bf16);
    b.At<float>(j.lse)[r * j.lse_stride] = lse;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchBuffers>> HostBatchRunner::Run(const BatchSteps& steps) {
  RETURN_IF_ERROR(ValidateBatchSteps(steps));
  RETURN_IF_ERROR(CheckExecutable(steps));
  auto buffers = std::make_unique<HostBuffers>(steps);
  const HostBuffers& b = *buffers;
  for (const StageCopy& copy : steps.staging) RunStageCopy(copy, b.At<Bf16>(copy.dst));
  for (const BatchStep& step : steps.steps) {
    if (const auto* p = std::get_if<ProjectionStep>(&step)) {
      pool_.Run(static_cast<int64_t>(p->jobs.size()),
                [&](int64_t i) { RunProjection(b, p->jobs[i]); });
    } else if (const auto* a = std::get_if<AttentionStep>(&step)) {
      pool_.Run(static_cast<int64_t>(a->groups.size()),
                [&](int64_t i) { RunRowGroup(b, *a, a->groups[i]); });
    } else {
      // A merge's rows are independent: slices of them spread one query's split-KV merge
      // (128 rows x 16 parts on 16 threads) instead of leaving it to one thread.
      const auto& c = std::get<CombineStep>(step);
      std::vector<std::pair<int, int>> slices;  // (job, first row)
      for (int i = 0; i < static_cast<int>(c.jobs.size()); ++i) {
        for (int r = 0; r < c.jobs[i].rows; r += kCombineSliceRows) slices.emplace_back(i, r);
      }
      pool_.Run(static_cast<int64_t>(slices.size()), [&](int64_t s) {
        const auto [i, first] = slices[s];
        RunCombine(b, c.jobs[i], first, std::min(first + kCombineSliceRows, c.jobs[i].rows));
      });
    }
  }
  return buffers;
}

}  // namespace mlaserve
