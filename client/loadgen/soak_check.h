#ifndef MLASERVE_CLIENT_LOADGEN_SOAK_CHECK_H_
#define MLASERVE_CLIENT_LOADGEN_SOAK_CHECK_H_

#include <span>
#include <string>

#include "kernels/core/bfloat16.h"

namespace mlaserve::loadgen {

// FlashMLA's dense-decode acceptance test, as the repository's tests apply it to latent
// answers on the bf16 cache (docs/numerics.md, "Tolerances used by the tests";
// tests/integration/integration_server.h): an element passes if its absolute error is below
// abs_tol OR its relative error below rel_tol; the output as a whole needs
// cos_diff = 1 - 2 sum(ab) / sum(a^2 + b^2) below cos_tol.
struct AnswerTolerance {
  double abs_tol;
  double rel_tol;
  double cos_tol;  // <= 0: no cosine check
};

// Outputs: FlashMLA's 8e-4 absolute bound belongs to values ~ randn/10; the soak's values are
// unit-sigma, and attention output is linear in V, so the bound scales by 1 / 0.1.
inline constexpr AnswerTolerance kSoakOutTolerance{8e-4 / 0.1, 2.01 / 128, 5e-6};
inline constexpr AnswerTolerance kSoakLseTolerance{1e-6, 8.01 / 65536, 0.0};

// How one answer compares with its fp64 golden.
struct AnswerCheck {
  bool ok = true;
  double max_abs_out = 0;  // largest |answer - golden| of an output element
  double max_abs_lse = 0;
  double cos_diff = 0;  // of the whole output
  // Largest min(abs error / abs_tol, relative error / rel_tol) over every element, outputs and
  // LSEs: an element passes below 1, so this says how close the answer came to failing.
  double worst_bound_ratio = 0;
  std::string why;  // the first failure, empty when ok
};

// Checks a latent-space decode answer against the golden the repository's reference kernel
// (kernels/reference/golden_attention.h) computes in fp64 from the same bf16 inputs.
// q: [sq][heads][dk]; keys: the sequence's rows [n][dk] as the server holds them (prefix rows
// first), whose first dl columns are the values; out: [sq][heads][dl] and lse: [sq][heads]
// as answered (the bf16 output widened to fp32). MTP tokens are causal: token s of sq sees
// keys [0, n - sq + s + 1).
AnswerCheck CheckLatentAnswer(std::span<const Bf16> q, int sq, int heads, int dk, int dl,
                              std::span<const Bf16> keys, double softmax_scale,
                              std::span<const float> out, std::span<const float> lse);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_SOAK_CHECK_H_
