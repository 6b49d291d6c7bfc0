#ifndef MLASERVE_KERNELS_CORE_FP8_PAGED_KV_CACHE_H_
#define MLASERVE_KERNELS_CORE_FP8_PAGED_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/float8_e4m3.h"
#include "kernels/core/fp8_latent_row.h"
#include "kernels/core/paged_kv_cache.h"

namespace mlaserve {

// Where a page of the FP8 latent cache keeps its tokens (docs/numerics.md, "FP8 latent cache",
// has the byte map). A page holds page_size tokens in three sections, each token-major:
//
//     [0,                      page_size * dl)             content, e4m3, dl bytes per token
//     [page_size * dl,         page_size * (dl + 4))       scales, fp32 (host byte order)
//     [page_size * (dl + 4),   page_size * (dl + 4 + 2dr)) rope / scale, bf16
//
// 644 bytes per token for dl = 512, dr = 64, against 1152 in bf16. Sections rather than one
// packed record per token: a block of keys' content is then one dense [tokens][dl] fp8 matrix,
// the operand a matrix unit reads, and its scales one contiguous vector.
struct Fp8PageLayout {
  int page_size = 0;
  int dl = 0;  // multiple of 4, so the scales section is 4-byte aligned
  int dr = 0;
  // Bytes from one page to the next, when pages sit in larger slots (a store whose slots are
  // sized for bf16 pages puts an FP8 page of more tokens in each); 0: page_bytes().
  int64_t page_stride = 0;

  static constexpr int64_t BytesPerToken(int dl, int dr) {
    return dl + static_cast<int64_t>(sizeof(float)) + dr * static_cast<int64_t>(sizeof(Bf16));
  }
  int64_t page_bytes() const { return page_size * BytesPerToken(dl, dr); }
  int64_t stride() const { return page_stride > 0 ? page_stride : page_bytes(); }
  int64_t content_offset(int row) const { return static_cast<int64_t>(row) * dl; }
  int64_t scale_offset(int row) const {
    return static_cast<int64_t>(page_size) * dl + row * static_cast<int64_t>(sizeof(float));
  }
  int64_t rope_offset(int row) const {
    return static_cast<int64_t>(page_size) * (dl + static_cast<int64_t>(sizeof(float))) +
           static_cast<int64_t>(row) * dr * static_cast<int64_t>(sizeof(Bf16));
  }
};

// One layer's FP8 latent cache: num_pages pages, layout.stride() bytes apart from `base`.
struct Fp8PagedKvCache {
  const std::byte* base = nullptr;
  int64_t num_pages = 0;
  Fp8PageLayout layout;

  const std::byte* page(int64_t p) const { return base + p * layout.stride(); }
  const Fp8E4m3* content(int64_t p, int row) const {
    return reinterpret_cast<const Fp8E4m3*>(page(p) + layout.content_offset(row));
  }
  float scale(int64_t p, int row) const {
    float s;
    std::memcpy(&s, page(p) + layout.scale_offset(row), sizeof s);
    return s;
  }
  const Bf16* rope(int64_t p, int row) const {
    return reinterpret_cast<const Bf16*>(page(p) + layout.rope_offset(row));
  }
};

// One request's tokens in the FP8 cache from `first_token` on (a suffix after a shared
// prefix starts mid-sequence), as the FP8 kernels read them block by block. The caller has
// validated the tables.
struct Fp8SequenceKeys {
  Fp8PagedKvCache cache;
  std::span<const int32_t> pages;  // the sequence's block table, token order
  int32_t first_token = 0;
  int32_t length = 0;  // tokens from first_token on

  // Tokens [begin, begin + count): keys[t] = [content widened to bf16 | rope] (dl + dr values
  // each, rows `ldk` apart) and scales[t]. Widening e4m3 to bf16 is exact.
  void Widen(int begin, int count, Bf16* keys, int64_t ldk, float* scales) const;
};

// Quantises `row` ([dl + dr]) into token `row_in_page` of the page at `page`.
void WriteFp8Token(const Fp8PageLayout& layout, std::byte* page, int row_in_page, const Bf16* row);

// The FP8 form of a whole bf16 paged cache ([pages][page_size][dl + dr]), page for page, in
// the layout {page_size, dl, width - dl}: what a store that quantises on append would hold.
std::vector<std::byte> QuantizePagedCache(const PagedKvCache& cache, int dl);

// Checks the layout (positive sizes, dl a multiple of 4) and the sequences against it, as
// ValidatePagedDecode does for the bf16 cache.
absl::Status ValidateFp8PagedDecode(float softmax_scale, int64_t q_batch,
                                    const Fp8PagedKvCache& cache, const PagedSequences& seqs);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_FP8_PAGED_KV_CACHE_H_
