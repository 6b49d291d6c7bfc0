#ifndef MLASERVE_KERNELS_CORE_PAGED_KV_CACHE_H_
#define MLASERVE_KERNELS_CORE_PAGED_KV_CACHE_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve {

// One layer's latent KV cache as fixed-size pages: [num_pages][page_size][width] bf16, where
// a token's row is c_kv (Dl) followed by k_pe (Dr), 576 values for DeepSeek-V3 / Kimi K2.
struct PagedKvCache {
  TensorView<const Bf16, 3> pages;

  int64_t num_pages() const { return pages.dim(0); }
  int page_size() const { return static_cast<int>(pages.dim(1)); }
  int width() const { return static_cast<int>(pages.dim(2)); }
};

// Which pages each request reads (FlashMLA's block_table / cache_seqlens): token t of request
// b lives in page block_table(b, t / page_size) at row t % page_size; seqlens[b] tokens are
// valid. Entries past a request's last page are never read and may hold anything.
struct PagedSequences {
  TensorView<const int32_t, 2> block_table;  // [batch][max_pages_per_sequence]
  std::span<const int32_t> seqlens;          // [batch]

  int batch() const { return static_cast<int>(seqlens.size()); }
};

// Checks that every page a request reads exists and that its length fits its table row.
absl::Status ValidatePagedSequences(int64_t num_pages, int page_size, const PagedSequences& seqs);
inline absl::Status ValidatePagedSequences(const PagedKvCache& cache, const PagedSequences& seqs) {
  return ValidatePagedSequences(cache.num_pages(), cache.page_size(), seqs);
}

// What every paged decode problem checks besides its own shapes: a positive finite softmax
// scale, one sequence per query batch entry (`q_batch`), and the sequences themselves.
// Any cache with `num_pages` pages of `page_size` tokens (bf16 or FP8).
absl::Status ValidatePagedDecode(float softmax_scale, int64_t q_batch, int64_t num_pages,
                                 int page_size, const PagedSequences& seqs);
inline absl::Status ValidatePagedDecode(float softmax_scale, int64_t q_batch,
                                        const PagedKvCache& cache, const PagedSequences& seqs) {
  return ValidatePagedDecode(softmax_scale, q_batch, cache.num_pages(), cache.page_size(), seqs);
}

// Row of token t of request b. The caller has validated the tables.
inline const Bf16* TokenRow(const PagedKvCache& cache, const PagedSequences& seqs, int b, int t) {
  const int page = seqs.block_table(b, t / cache.page_size());
  return cache.pages.row(page, t % cache.page_size());
}

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_PAGED_KV_CACHE_H_
