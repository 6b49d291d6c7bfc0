#include "tests/testing/attention_checks.h"

#include <cmath>
#include <vector>

#include "kernels/core/bfloat16.h"

namespace mlaserve::testing {

::testing::AssertionResult AllClose(std::span<const float> actual, std::span<const double> expected,
                                    const Tolerance& tol, bool round_to_bf16) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " vs expected " << expected.size();
  }
  double dot = 0.0, norms = 0.0;
  size_t failures = 0, first_failure = 0;
  double worst_abs = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = round_to_bf16 ? RoundToBf16(actual[i]) : actual[i];
    const double e = expected[i];
    if (std::isinf(a) || std::isinf(e) || std::isnan(a) || std::isnan(e)) {
      const bool same = (std::isinf(a) && std::isinf(e) && std::signbit(a) == std::signbit(e));
      if (!same) {
        if (failures++ == 0) first_failure = i;
      }
      continue;
    }
    dot += a * e;
    norms += a * a + e * e;
    const double abs_err = std::fabs(a - e);
    const double rel_err = abs_err / std::max(std::fabs(e), 1e-30);
    worst_abs = std::max(worst_abs, abs_err);
    if (!(abs_err < tol.abs_tol || rel_err < tol.rel_tol)) {
      if (failures++ == 0) first_failure = i;
    }
  }
  if (failures > 0) {
    const double a = actual[first_failure];
    return ::testing::AssertionFailure()
           << failures << " of " << actual.size() << " elements out of tolerance; first at ["
           << first_failure << "]: got " << a << " expected " << expected[first_failure]
           << " (worst abs err " << worst_abs << ")";
  }
  if (tol.cos_tol > 0.0 && norms > 0.0) {
    const double cos_diff = 1.0 - 2.0 * dot / norms;
    if (cos_diff > tol.cos_tol) {
      return ::testing::AssertionFailure() << "cos_diff " << cos_diff << " exceeds " << tol.cos_tol;
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult AllCloseF(std::span<const float> actual, std::span<const float> expected,
                                     const Tolerance& tol) {
  std::vector<double> e(expected.size());
  for (size_t i = 0; i < e.size(); ++i) e[i] = RoundToBf16(expected[i]);
  return AllClose(actual, e, tol, /*round_to_bf16=*/true);
}

}  // namespace mlaserve::testing
