#include "kernels/core/latent_decode.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/vector_ops.h"

namespace mlaserve {

absl::Status ValidateLatentDecodeProblem(const LatentDecodeProblem& p) {
  if (p.q.stride(3) != 1 || p.cache.pages.stride(2) != 1) {
    return absl::InvalidArgumentError("q and cache rows must be contiguous in their last axis");
  }
  if (p.dk() != p.cache.width()) {
    return absl::InvalidArgumentError(
        absl::StrCat("q head dim ", p.dk(), " differs from cache width ", p.cache.width()));
  }
  if (p.dv <= 0 || p.dv > p.dk()) {
    return absl::InvalidArgumentError(absl::StrCat("dv = ", p.dv, " must be in [1, ", p.dk(), "]"));
  }
  return ValidatePagedDecode(p.softmax_scale, p.batch(), p.cache, p.seqs);
}

absl::StatusOr<AttentionOutput> RunLatentDecode(const LatentDecodeProblem& p, RowKernel kernel) {
  RETURN_IF_ERROR(ValidateLatentDecodeProblem(p));
  const int rows_per_request = p.sq() * p.heads();
  AttentionOutput result;
  result.out.resize(static_cast<size_t>(p.batch()) * rows_per_request * p.dv);
  result.lse.resize(static_cast<size_t>(p.batch()) * rows_per_request);

  std::vector<float> q(static_cast<size_t>(rows_per_request) * p.dk());
  std::vector<int32_t> visible(rows_per_request);
  for (int b = 0; b < p.batch(); ++b) {
    for (int s = 0; s < p.sq(); ++s) {
      const int keys = VisibleKeys(p.seqs.seqlens[b], p.sq(), s, p.causal);
      for (int h = 0; h < p.heads(); ++h) {
        const int row = s * p.heads() + h;
        visible[row] = keys;
        WidenBf16(p.q.row(b, s, h), p.dk(), q.data() + static_cast<int64_t>(row) * p.dk());
      }
    }
    PagedLatentSource source(p.cache, p.seqs, b, p.dv);
    const int64_t first_row = static_cast<int64_t>(b) * rows_per_request;
    kernel(QueryRows{q.data(), p.dk(), rows_per_request, p.dk(), visible}, source, p.softmax_scale,
           RowOutputs{result.out.data() + first_row * p.dv, p.dv, result.lse.data() + first_row});
  }
  return result;
}

}  // namespace mlaserve
