#ifndef MLASERVE_SERVER_ENGINE_KV_PAGE_POOL_H_
#define MLASERVE_SERVER_ENGINE_KV_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/paged_kv_cache.h"
#include "server/engine/kv/anonymous_mapping.h"

namespace mlaserve::engine {

// The memory all latent KV pages live in, for every layer: one array
// [num_pages][page_size][row_width] bf16. One array (not one per layer) lets a kernel view the
// whole pool as a single PagedKvCache whose block tables are plain page ids.
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
  static absl::StatusOr<PagePool> Create(int32_t num_pages, int page_size, int row_width);

  PagePool(PagePool&&) = default;
  PagePool& operator=(PagePool&&) = default;

  int32_t num_pages() const { return num_pages_; }
  int page_size() const { return page_size_; }
  int row_width() const { return row_width_; }
  int64_t page_bytes() const {
    return static_cast<int64_t>(page_size_) * row_width_ * static_cast<int64_t>(sizeof(Bf16));
  }

  // The whole pool as a kernel's paged cache.
  PagedKvCache View() const;

  // First element of row `row` of page `page`; rows of a page are consecutive.
  Bf16* Row(int32_t page, int row) const {
    return base() + (static_cast<int64_t>(page) * page_size_ + row) * row_width_;
  }

  // Writes rows[0, n) (row r at rows + r * row_stride, row_width() elements each) to token
  // positions [first_token, first_token + n) of the sequence whose block table is `pages`.
  void WriteTokens(std::span<const int32_t> pages, int64_t first_token, const Bf16* rows,
                   int64_t row_stride, int64_t n) const;

  // Copies rows [0, rows) of page `from` to page `to`: the copy half of copy-on-write.
  void CopyRows(int32_t from, int32_t to, int rows) const;

 private:
  PagePool() = default;
  Bf16* base() const { return static_cast<Bf16*>(memory_.data()); }

  AnonymousMapping memory_;
  int32_t num_pages_ = 0;
  int page_size_ = 0;
  int row_width_ = 0;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_PAGE_POOL_H_
