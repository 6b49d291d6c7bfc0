#include "server/engine/kv/page_pool.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve::engine {

absl::StatusOr<PagePool> PagePool::Create(int32_t num_pages, int page_size, int row_width) {
  if (num_pages <= 0 || page_size <= 0 || row_width <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("page pool: num_pages (", num_pages,
                                                   "), page_size (", page_size, ") and row_width (",
                                                   row_width, ") must be positive"));
  }
  PagePool pool;
  pool.num_pages_ = num_pages;
  pool.page_size_ = page_size;
  pool.row_width_ = row_width;
  absl::StatusOr<AnonymousMapping> memory = AnonymousMapping::Create(
      static_cast<std::size_t>(num_pages) * pool.page_bytes(), AnonymousMapping::Use::kSparse);
  if (!memory.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("page pool of ", num_pages, " pages: ", memory.status().message()));
  }
  pool.memory_ = *std::move(memory);
  return pool;
}

PagedKvCache PagePool::View() const {
  const std::span<const Bf16> all(base(),
                                  static_cast<std::size_t>(num_pages_) * page_size_ * row_width_);
  // The shape matches the mapping by construction.
  return PagedKvCache{
      *TensorView<const Bf16, 3>::Create(all, {num_pages_, page_size_, row_width_}, "page pool")};
}

void PagePool::WriteTokens(std::span<const int32_t> pages, int64_t first_token, const Bf16* rows,
                           int64_t row_stride, int64_t n) const {
  for (int64_t done = 0; done < n;) {
    const int64_t token = first_token + done;
    const int row = static_cast<int>(token % page_size_);
    const int64_t run = std::min<int64_t>(page_size_ - row, n - done);
    Bf16* dst = Row(pages[token / page_size_], row);
    const Bf16* src = rows + done * row_stride;
    if (row_stride == row_width_) {
      std::memcpy(dst, src, static_cast<std::size_t>(run) * row_width_ * sizeof(Bf16));
    } else {
      for (int64_t r = 0; r < run; ++r) {
        std::memcpy(dst + r * row_width_, src + r * row_stride, row_width_ * sizeof(Bf16));
      }
    }
    done += run;
  }
}

void PagePool::CopyRows(int32_t from, int32_t to, int rows) const {
  std::memcpy(Row(to, 0), Row(from, 0), static_cast<std::size_t>(rows) * row_width_ * sizeof(Bf16));
}

}  // namespace mlaserve::engine
