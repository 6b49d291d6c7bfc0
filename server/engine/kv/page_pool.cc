#include "server/engine/kv/page_pool.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve::engine {

absl::StatusOr<PagePool> PagePool::Create(int32_t num_pages, int page_size, int dl, int dr,
                                          std::shared_ptr<PageWriteListener> writes) {
  const int row_width = dl + dr;
  if (num_pages <= 0 || page_size <= 0 || dl <= 0 || dl % 4 != 0 || dr < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page pool: num_pages (", num_pages, "), page_size (", page_size, ") and dl (",
                     dl, ", a multiple of 4) must be positive, dr (", dr, ") not negative"));
  }
  PagePool pool;
  pool.num_pages_ = num_pages;
  pool.page_size_ = page_size;
  pool.row_width_ = row_width;
  pool.fp8_layout_ =
      Fp8PageLayout{static_cast<int>(pool.page_bytes() / Fp8PageLayout::BytesPerToken(dl, dr)), dl,
                    dr, pool.page_bytes()};
  if (pool.fp8_layout_.page_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("page pool: a page of ", pool.page_bytes(), " bytes holds no FP8 token"));
  }
  absl::StatusOr<AnonymousMapping> memory = AnonymousMapping::Create(
      static_cast<std::size_t>(num_pages) * pool.page_bytes(), AnonymousMapping::Use::kSparse);
  if (!memory.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("page pool of ", num_pages, " pages: ", memory.status().message()));
  }
  pool.memory_ = *std::move(memory);
  pool.writes_ = std::move(writes);
  return pool;
}

void PagePool::NoteWritten(KvDtype dtype, int32_t page, int64_t first_row, int64_t rows) const {
  if (writes_ == nullptr || rows <= 0) return;
  if (dtype == KvDtype::kBf16) {
    const int64_t row_bytes = int64_t{row_width_} * static_cast<int64_t>(sizeof(Bf16));
    writes_->Written(page, first_row * row_bytes, (first_row + rows) * row_bytes);
    return;
  }
  const Fp8PageLayout& l = fp8_layout_;
  const int last = static_cast<int>(first_row + rows);
  const int first = static_cast<int>(first_row);
  writes_->Written(page, l.content_offset(first), l.content_offset(last));
  writes_->Written(page, l.scale_offset(first), l.scale_offset(last));
  writes_->Written(page, l.rope_offset(first), l.rope_offset(last));
}

PagedKvCache PagePool::View() const {
  const std::span<const Bf16> all(base(),
                                  static_cast<std::size_t>(num_pages_) * page_size_ * row_width_);
  // The shape matches the mapping by construction.
  return PagedKvCache{
      *TensorView<const Bf16, 3>::Create(all, {num_pages_, page_size_, row_width_}, "page pool")};
}

Fp8PagedKvCache PagePool::Fp8View() const {
  return Fp8PagedKvCache{static_cast<const std::byte*>(memory_.data()), num_pages_, fp8_layout_};
}

void PagePool::WriteTokens(KvDtype dtype, std::span<const int32_t> pages, int64_t first_token,
                           const Bf16* rows, int64_t row_stride, int64_t n) const {
  if (dtype == KvDtype::kFp8) {
    const int tokens = fp8_layout_.page_size;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t token = first_token + r;
      WriteFp8Token(fp8_layout_, Slot(pages[token / tokens]), static_cast<int>(token % tokens),
                    rows + r * row_stride);
      NoteWritten(dtype, pages[token / tokens], token % tokens, 1);
    }
    return;
  }
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
    NoteWritten(dtype, pages[token / page_size_], row, run);
    done += run;
  }
}

void PagePool::WriteFp8Records(std::span<const int32_t> pages, int64_t first_token,
                               const std::byte* records, int64_t n) const {
  const Fp8PageLayout& l = fp8_layout_;
  const int64_t record = Fp8PageLayout::BytesPerToken(l.dl, l.dr);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t token = first_token + r;
    std::byte* page = Slot(pages[token / l.page_size]);
    const int row = static_cast<int>(token % l.page_size);
    const std::byte* src = records + r * record;
    std::memcpy(page + l.content_offset(row), src, l.dl);
    std::memcpy(page + l.scale_offset(row), src + l.dl, sizeof(float));
    std::memcpy(page + l.rope_offset(row), src + l.dl + sizeof(float), l.dr * sizeof(Bf16));
    NoteWritten(KvDtype::kFp8, pages[token / l.page_size], row, 1);
  }
}

std::optional<int64_t> PagePool::FirstDifferingRow(KvDtype dtype, std::span<const int32_t> pages,
                                                   int64_t first_token, const Bf16* rows,
                                                   int64_t row_stride, int64_t n) const {
  if (dtype == KvDtype::kBf16) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t token = first_token + r;
      const Bf16* stored = Row(pages[token / page_size_], static_cast<int>(token % page_size_));
      if (std::memcmp(stored, rows + r * row_stride, row_width_ * sizeof(Bf16)) != 0) return r;
    }
    return std::nullopt;
  }
  // Compare the record each row would become.
  const Fp8PageLayout& l = fp8_layout_;
  const int64_t record = Fp8PageLayout::BytesPerToken(l.dl, l.dr);
  std::vector<std::byte> scratch(static_cast<size_t>(l.page_bytes()));
  std::vector<std::byte> quantised(static_cast<size_t>(record));
  for (int64_t r = 0; r < n; ++r) {
    const int row = static_cast<int>((first_token + r) % l.page_size);
    WriteFp8Token(l, scratch.data(), row, rows + r * row_stride);
    std::memcpy(quantised.data(), scratch.data() + l.content_offset(row), l.dl);
    std::memcpy(quantised.data() + l.dl, scratch.data() + l.scale_offset(row), sizeof(float));
    std::memcpy(quantised.data() + l.dl + sizeof(float), scratch.data() + l.rope_offset(row),
                l.dr * sizeof(Bf16));
    if (FirstDifferingFp8Record(pages, first_token + r, quantised.data(), 1)) return r;
  }
  return std::nullopt;
}

std::optional<int64_t> PagePool::FirstDifferingFp8Record(std::span<const int32_t> pages,
                                                         int64_t first_token,
                                                         const std::byte* records,
                                                         int64_t n) const {
  const Fp8PageLayout& l = fp8_layout_;
  const int64_t record = Fp8PageLayout::BytesPerToken(l.dl, l.dr);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t token = first_token + r;
    const std::byte* page = Slot(pages[token / l.page_size]);
    const int row = static_cast<int>(token % l.page_size);
    const std::byte* src = records + r * record;
    if (std::memcmp(page + l.content_offset(row), src, l.dl) != 0 ||
        std::memcmp(page + l.scale_offset(row), src + l.dl, sizeof(float)) != 0 ||
        std::memcmp(page + l.rope_offset(row), src + l.dl + sizeof(float), l.dr * sizeof(Bf16)) !=
            0) {
      return r;
    }
  }
  return std::nullopt;
}

void PagePool::ReadRecords(KvDtype dtype, int32_t page, int n, std::byte* out) const {
  if (dtype == KvDtype::kBf16) {
    std::memcpy(out, Row(page, 0), static_cast<std::size_t>(n) * row_width_ * sizeof(Bf16));
    return;
  }
  const Fp8PageLayout& l = fp8_layout_;
  const int64_t record = Fp8PageLayout::BytesPerToken(l.dl, l.dr);
  const std::byte* slot = Slot(page);
  for (int row = 0; row < n; ++row) {
    std::byte* dst = out + row * record;
    std::memcpy(dst, slot + l.content_offset(row), l.dl);
    std::memcpy(dst + l.dl, slot + l.scale_offset(row), sizeof(float));
    std::memcpy(dst + l.dl + sizeof(float), slot + l.rope_offset(row), l.dr * sizeof(Bf16));
  }
}

void PagePool::WriteRecords(KvDtype dtype, int32_t page, int n, const std::byte* records) const {
  if (dtype == KvDtype::kBf16) {
    std::memcpy(Row(page, 0), records, static_cast<std::size_t>(n) * row_width_ * sizeof(Bf16));
    NoteWritten(dtype, page, 0, n);
    return;
  }
  const int32_t pages[] = {page};
  WriteFp8Records(pages, 0, records, n);
}

void PagePool::CopyRows(KvDtype dtype, int32_t from, int32_t to, int rows) const {
  if (dtype == KvDtype::kBf16) {
    std::memcpy(Row(to, 0), Row(from, 0),
                static_cast<std::size_t>(rows) * row_width_ * sizeof(Bf16));
    NoteWritten(dtype, to, 0, rows);
    return;
  }
  const Fp8PageLayout& l = fp8_layout_;
  const std::byte* src = Slot(from);
  std::byte* dst = Slot(to);
  std::memcpy(dst + l.content_offset(0), src + l.content_offset(0), int64_t{rows} * l.dl);
  std::memcpy(dst + l.scale_offset(0), src + l.scale_offset(0), rows * sizeof(float));
  std::memcpy(dst + l.rope_offset(0), src + l.rope_offset(0), int64_t{rows} * l.dr * sizeof(Bf16));
  NoteWritten(dtype, to, 0, rows);
}

}  // namespace mlaserve::engine
