#include "kernels/core/head_space_decode.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace mlaserve {

absl::Status ValidateHeadSpaceDecodeProblem(const HeadSpaceDecodeProblem& p) {
  if (p.q_pe.dim(0) != p.batch() || p.q_pe.dim(1) != p.sq() || p.q_pe.dim(2) != p.heads()) {
    return absl::InvalidArgumentError("q_pe must have the batch, sq and heads of q_nope");
  }
  if (p.weights.heads() != p.heads() || p.weights.w_uv.dim(0) != p.heads()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights have ", p.weights.heads(), " heads but q has ", p.heads()));
  }
  if (p.weights.dn() != p.dn()) {
    return absl::InvalidArgumentError(
        absl::StrCat("W_UK rows (", p.weights.dn(), ") differ from q_nope width ", p.dn()));
  }
  if (p.weights.w_uv.dim(2) != p.dl()) {
    return absl::InvalidArgumentError("W_UK and W_UV disagree on the latent width");
  }
  if (p.cache.width() != p.dl() + p.dr()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache width ", p.cache.width(), " is not dl + dr = ", p.dl() + p.dr()));
  }
  if (p.q_nope.stride(3) != 1 || p.q_pe.stride(3) != 1 || p.cache.pages.stride(2) != 1 ||
      p.weights.w_uk.stride(2) != 1 || p.weights.w_uv.stride(2) != 1) {
    return absl::InvalidArgumentError("tensors must be contiguous in their last axis");
  }
  return ValidatePagedDecode(p.softmax_scale, p.batch(), p.cache, p.seqs);
}

}  // namespace mlaserve
