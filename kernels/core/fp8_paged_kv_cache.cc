#include "kernels/core/fp8_paged_kv_cache.h"

#include "absl/strings/str_cat.h"

namespace mlaserve {

void WriteFp8Token(const Fp8PageLayout& layout, std::byte* page, int row_in_page, const Bf16* row) {
  float scale = 0.0f;
  QuantizeLatentRow(
      row, layout.dl, layout.dr,
      Fp8LatentRow{reinterpret_cast<Fp8E4m3*>(page + layout.content_offset(row_in_page)), &scale,
                   reinterpret_cast<Bf16*>(page + layout.rope_offset(row_in_page))});
  std::memcpy(page + layout.scale_offset(row_in_page), &scale, sizeof scale);
}

void Fp8SequenceKeys::Widen(int begin, int count, Bf16* keys, int64_t ldk, float* scales) const {
  const Fp8PageLayout& layout = cache.layout;
  for (int t = 0; t < count; ++t) {
    const int64_t token = static_cast<int64_t>(first_token) + begin + t;
    const int32_t page = pages[token / layout.page_size];
    const int row = static_cast<int>(token % layout.page_size);
    Bf16* key = keys + t * ldk;
    WidenFp8ToBf16(cache.content(page, row), layout.dl, key);
    std::memcpy(key + layout.dl, cache.rope(page, row), layout.dr * sizeof(Bf16));
    scales[t] = cache.scale(page, row);
  }
}

std::vector<std::byte> QuantizePagedCache(const PagedKvCache& cache, int dl) {
  const Fp8PageLayout layout{cache.page_size(), dl, cache.width() - dl};
  std::vector<std::byte> bytes(static_cast<size_t>(cache.num_pages() * layout.page_bytes()));
  for (int64_t p = 0; p < cache.num_pages(); ++p) {
    for (int row = 0; row < layout.page_size; ++row) {
      WriteFp8Token(layout, bytes.data() + p * layout.page_bytes(), row, cache.pages.row(p, row));
    }
  }
  return bytes;
}

absl::Status ValidateFp8PagedDecode(float softmax_scale, int64_t q_batch,
                                    const Fp8PagedKvCache& cache, const PagedSequences& seqs) {
  const Fp8PageLayout& layout = cache.layout;
  if (layout.dl <= 0 || layout.dl % 4 != 0 || layout.dr < 0 ||
      (layout.page_stride != 0 && layout.page_stride < layout.page_bytes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache: dl = ", layout.dl, ", dr = ", layout.dr, ", page_stride = ", layout.page_stride,
        " (dl must be a positive multiple of 4, a stride at least a page)"));
  }
  return ValidatePagedDecode(softmax_scale, q_batch, cache.num_pages, layout.page_size, seqs);
}

}  // namespace mlaserve
