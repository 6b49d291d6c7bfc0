#include "kernels/core/paged_kv_cache.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace mlaserve {

absl::Status ValidatePagedSequences(int64_t num_pages, int page_size, const PagedSequences& seqs) {
  if (page_size <= 0) {
    return absl::InvalidArgumentError("cache: page_size must be positive");
  }
  if (seqs.block_table.dim(0) != seqs.batch()) {
    return absl::InvalidArgumentError(absl::StrCat("block_table has ", seqs.block_table.dim(0),
                                                   " rows but seqlens has ", seqs.batch()));
  }
  const int64_t max_pages = seqs.block_table.dim(1);
  for (int b = 0; b < seqs.batch(); ++b) {
    const int64_t len = seqs.seqlens[b];
    if (len < 0) {
      return absl::InvalidArgumentError(absl::StrCat("seqlens[", b, "] is negative (", len, ")"));
    }
    const int64_t pages_needed = (len + page_size - 1) / page_size;
    if (pages_needed > max_pages) {
      return absl::InvalidArgumentError(
          absl::StrCat("seqlens[", b, "] = ", len, " needs ", pages_needed,
                       " pages but block_table rows hold ", max_pages));
    }
    for (int64_t j = 0; j < pages_needed; ++j) {
      const int32_t page = seqs.block_table(b, j);
      if (page < 0 || page >= num_pages) {
        return absl::InvalidArgumentError(absl::StrCat("block_table[", b, "][", j, "] = ", page,
                                                       " is not a page of the cache (", num_pages,
                                                       " pages)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePagedDecode(float softmax_scale, int64_t q_batch, int64_t num_pages,
                                 int page_size, const PagedSequences& seqs) {
  if (!(softmax_scale > 0.0f) || !std::isfinite(softmax_scale)) {
    return absl::InvalidArgumentError("softmax_scale must be a positive finite number");
  }
  if (seqs.batch() != q_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("q has batch ", q_batch, " but seqlens has ", seqs.batch()));
  }
  return ValidatePagedSequences(num_pages, page_size, seqs);
}

}  // namespace mlaserve
