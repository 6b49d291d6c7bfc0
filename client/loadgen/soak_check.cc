#include "client/loadgen/soak_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/reference/golden_attention.h"

namespace mlaserve::loadgen {
namespace {

// Where one element stands against a tolerance: min(abs / abs_tol, rel / rel_tol), with
// infinities required to match exactly (an infinite LSE is a row that saw no key).
double BoundRatio(double actual, double expected, const AnswerTolerance& tol) {
  if (std::isinf(expected) || std::isinf(actual) || std::isnan(actual)) {
    return actual == expected ? 0.0 : std::numeric_limits<double>::infinity();
  }
  const double err = std::abs(actual - expected);
  const double rel =
      expected != 0 ? err / std::abs(expected) : std::numeric_limits<double>::infinity();
  return std::min(err / tol.abs_tol, rel / tol.rel_tol);
}

}  // namespace

AnswerCheck CheckLatentAnswer(std::span<const Bf16> q, int sq, int heads, int dk, int dl,
                              std::span<const Bf16> keys, double softmax_scale,
                              std::span<const float> out, std::span<const float> lse) {
  AnswerCheck check;
  const int rows = sq * heads;
  const int n = static_cast<int>(keys.size() / static_cast<size_t>(dk));
  if (q.size() != static_cast<size_t>(rows) * dk || out.size() != static_cast<size_t>(rows) * dl ||
      lse.size() != static_cast<size_t>(rows)) {
    check.ok = false;
    check.why = absl::StrCat("answer shape: ", out.size(), " outputs and ", lse.size(),
                             " LSEs for ", rows, " rows of width ", dl);
    check.worst_bound_ratio = std::numeric_limits<double>::infinity();
    return check;
  }
  std::vector<double> qd(q.size()), k(keys.size()), v(static_cast<size_t>(n) * dl);
  for (size_t i = 0; i < q.size(); ++i) qd[i] = q[i].ToFloat();
  for (int t = 0; t < n; ++t) {
    for (int d = 0; d < dk; ++d) {
      const double x = keys[static_cast<size_t>(t) * dk + d].ToFloat();
      k[static_cast<size_t>(t) * dk + d] = x;
      if (d < dl) v[static_cast<size_t>(t) * dl + d] = x;
    }
  }
  std::vector<int32_t> visible(rows);
  for (int s = 0; s < sq; ++s) {
    for (int h = 0; h < heads; ++h) visible[s * heads + h] = std::max(0, n - sq + s + 1);
  }
  const GoldenOutput golden =
      GoldenAttentionRows(qd, rows, dk, k, v, n, dl, visible, softmax_scale);

  double dot = 0, norms = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double a = out[i], e = golden.out[i];
    const double ratio = BoundRatio(a, e, kSoakOutTolerance);
    check.max_abs_out = std::max(check.max_abs_out, std::abs(a - e));
    check.worst_bound_ratio = std::max(check.worst_bound_ratio, ratio);
    if (ratio >= 1 && check.ok) {
      check.ok = false;
      check.why = absl::StrCat("out[", i, "] = ", a, ", golden ", e);
    }
    dot += a * e;
    norms += a * a + e * e;
  }
  check.cos_diff = norms > 0 ? 1 - 2 * dot / norms : 0;
  if (kSoakOutTolerance.cos_tol > 0 && !(check.cos_diff < kSoakOutTolerance.cos_tol) && check.ok) {
    check.ok = false;
    check.why = absl::StrCat("cos_diff ", check.cos_diff, " >= ", kSoakOutTolerance.cos_tol);
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    const double a = lse[i], e = golden.lse[i];
    const double ratio = BoundRatio(a, e, kSoakLseTolerance);
    if (!std::isinf(e)) check.max_abs_lse = std::max(check.max_abs_lse, std::abs(a - e));
    check.worst_bound_ratio = std::max(check.worst_bound_ratio, ratio);
    if (ratio >= 1 && check.ok) {
      check.ok = false;
      check.why = absl::StrCat("lse[", i, "] = ", a, ", golden ", e);
    }
  }
  return check;
}

}  // namespace mlaserve::loadgen
