#ifndef MLASERVE_SERVER_ENGINE_KV_PAGE_POOL_H_
#define MLASERVE_SERVER_ENGINE_KV_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/kv_dtype.h"
#include "kernels/core/paged_kv_cache.h"
#include "server/engine/kv/anonymous_mapping.h"
#include "server/engine/kv/page_write_log.h"

namespace mlaserve::engine {

// The memory all latent KV pages live in, for every layer and both formats: one array of
// page slots, each page_bytes() = page_size * row_width bf16. A bf16 page is the slot as
// [page_size][row_width] bf16; an FP8 page (kernels/core/fp8_paged_kv_cache.h) puts
// fp8_page_tokens() = page_bytes() / (dl + 4 + 2 dr) tokens in the same slot (228 for a
// 128-token bf16 page of DeepSeek's rows: 1.78x the tokens). One array (not one per layer or
// format) lets a kernel view the whole pool as one cache of either format whose block tables
// are plain page ids, and keeps one allocator and one budget for both.
//
// The array is a sparse AnonymousMapping: a large budget costs address space, and RAM only
// for pages that have been written. Once written, a page stays resident while the pool lives
// (free pages are reused, not returned to the kernel).
//
// The pool object itself is immutable after construction; which rows may be written or read
// when is the owner's protocol (see KvStore), not the pool's.
class PagePool {
 public:
  // INVALID_ARGUMENT for non-positive sizes; RESOURCE_EXHAUSTED if the mapping fails.
  // row_width = dl + dr. INVALID_ARGUMENT also if an FP8 page would hold no token.
  // `writes`, if set, is told of every write into the pool (page_write_log.h).
  static absl::StatusOr<PagePool> Create(int32_t num_pages, int page_size, int dl, int dr,
                                         std::shared_ptr<PageWriteListener> writes = nullptr);

  PagePool(PagePool&&) = default;
  PagePool& operator=(PagePool&&) = default;

  int32_t num_pages() const { return num_pages_; }
  int page_size() const { return page_size_; }
  int row_width() const { return row_width_; }
  const Fp8PageLayout& fp8_layout() const { return fp8_layout_; }
  // Tokens a page of `dtype` holds.
  int page_tokens(KvDtype dtype) const {
    return dtype == KvDtype::kBf16 ? page_size_ : fp8_layout_.page_size;
  }
  int64_t page_bytes() const {
    return static_cast<int64_t>(page_size_) * row_width_ * static_cast<int64_t>(sizeof(Bf16));
  }

  // The whole pool as a kernel's paged cache, of bf16 pages and of FP8 pages.
  PagedKvCache View() const;
  Fp8PagedKvCache Fp8View() const;

  // First element of row `row` of page `page`; rows of a page are consecutive.
  Bf16* Row(int32_t page, int row) const {
    return base() + (static_cast<int64_t>(page) * page_size_ + row) * row_width_;
  }

  // Writes rows[0, n) (row r at rows + r * row_stride, row_width() elements each) to token
  // positions [first_token, first_token + n) of the sequence whose block table is `pages`.
  // Into FP8 pages the rows are quantised (QuantizeLatentRow).
  void WriteTokens(KvDtype dtype, std::span<const int32_t> pages, int64_t first_token,
                   const Bf16* rows, int64_t row_stride, int64_t n) const;
  // Writes n rows already in the FP8 form into FP8 pages: each record is dl e4m3 bytes, the
  // fp32 scale, dr bf16 (Fp8PageLayout::BytesPerToken bytes), records back to back.
  void WriteFp8Records(std::span<const int32_t> pages, int64_t first_token,
                       const std::byte* records, int64_t n) const;
  // Whether tokens [first_token, first_token + n) hold exactly what writing `rows` would.
  bool HoldsRows(KvDtype dtype, std::span<const int32_t> pages, int64_t first_token,
                 const Bf16* rows, int64_t row_stride, int64_t n) const {
    return !FirstDifferingRow(dtype, pages, first_token, rows, row_stride, n).has_value();
  }
  // The first r in [0, n) whose token first_token + r holds other bytes than writing rows[r]
  // would (an FP8 page compares the record the row quantises to); nullopt if none.
  std::optional<int64_t> FirstDifferingRow(KvDtype dtype, std::span<const int32_t> pages,
                                           int64_t first_token, const Bf16* rows,
                                           int64_t row_stride, int64_t n) const;
  // The same for n records already in the FP8 form (WriteFp8Records' layout).
  std::optional<int64_t> FirstDifferingFp8Record(std::span<const int32_t> pages,
                                                 int64_t first_token, const std::byte* records,
                                                 int64_t n) const;

  // Tokens [0, n) of page `page` as records (kv_state.h: a bf16 row, or the FP8 record
  // WriteFp8Records takes) into `out`, and back. Reads only those tokens' bytes, so a single
  // owner may append past them meanwhile.
  void ReadRecords(KvDtype dtype, int32_t page, int n, std::byte* out) const;
  void WriteRecords(KvDtype dtype, int32_t page, int n, const std::byte* records) const;

  // Copies tokens [0, rows) of page `from` to page `to`: the copy half of copy-on-write.
  void CopyRows(KvDtype dtype, int32_t from, int32_t to, int rows) const;

 private:
  PagePool() = default;
  Bf16* base() const { return static_cast<Bf16*>(memory_.data()); }
  std::byte* Slot(int32_t page) const {
    return static_cast<std::byte*>(memory_.data()) + static_cast<int64_t>(page) * page_bytes();
  }

  // Tells the listener what tokens [first_row, first_row + rows) of a page of `dtype` occupy.
  void NoteWritten(KvDtype dtype, int32_t page, int64_t first_row, int64_t rows) const;

  AnonymousMapping memory_;
  std::shared_ptr<PageWriteListener> writes_;
  int32_t num_pages_ = 0;
  int page_size_ = 0;
  int row_width_ = 0;
  Fp8PageLayout fp8_layout_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_PAGE_POOL_H_
