#ifndef MLASERVE_KERNELS_REFERENCE_GOLDEN_ATTENTION_H_
#define MLASERVE_KERNELS_REFERENCE_GOLDEN_ATTENTION_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/head_space_decode.h"
#include "kernels/core/latent_decode.h"

namespace mlaserve {

// The golden reference every kernel is judged against: exact-formula attention in fp64 on
// the (already bf16-rounded) inputs, with a two-pass softmax. It shares no code with the
// kernels beyond the input views and an fp64 GEMM.
struct GoldenOutput {
  std::vector<double> out;  // [rows][dv]
  std::vector<double> lse;  // [rows]; natural log, -inf for rows without keys
};

// Rows q [count][dk] against keys k [n][dk] and values v [n][dv]; row i sees keys
// [0, visible[i]).
GoldenOutput GoldenAttentionRows(std::span<const double> q, int count, int dk,
                                 std::span<const double> k, std::span<const double> v, int n,
                                 int dv, std::span<const int32_t> visible, double softmax_scale);

// A whole latent decode batch; rows ordered [batch][sq][heads] like AttentionOutput.
absl::StatusOr<GoldenOutput> GoldenLatentDecode(const LatentDecodeProblem& problem);

// A head-space batch computed the naive way entirely in fp64: K[h] = [c_kv W_UK[h]^T, k_pe],
// V[h] = c_kv W_UV[h]^T with no intermediate rounding. Rows ordered [batch][sq][heads].
absl::StatusOr<GoldenOutput> GoldenHeadSpaceDecode(const HeadSpaceDecodeProblem& problem);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_REFERENCE_GOLDEN_ATTENTION_H_
