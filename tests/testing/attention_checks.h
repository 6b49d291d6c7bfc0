#ifndef MLASERVE_TESTS_TESTING_ATTENTION_CHECKS_H_
#define MLASERVE_TESTS_TESTING_ATTENTION_CHECKS_H_

#include <span>

#include "gtest/gtest.h"

namespace mlaserve::testing {

// FlashMLA's dense-decode acceptance test (tests/kernelkit/compare.py), applied to a kernel's
// bf16-rounded output against the fp64 golden: an element passes if its absolute error is
// below abs_tol OR its relative error below rel_tol; the whole tensor must also have
// cos_diff = 1 - 2 sum(ab) / sum(a^2 + b^2) below cos_tol; infinities must match exactly.
struct Tolerance {
  double abs_tol;
  double rel_tol;
  double cos_tol;  // <= 0 disables the cosine check
};

inline constexpr Tolerance kFlashMlaOutTolerance{8e-4, 2.01 / 128, 5e-6};
inline constexpr Tolerance kFlashMlaLseTolerance{1e-6, 8.01 / 65536, 0.0};

// FlashMLA's absolute bound belongs to its data recipe (values ~ randn / 10). Attention
// output is linear in V, so for values drawn with another sigma the same test scales the
// absolute bound by sigma / 0.1; the relative and cosine bounds are scale-free.
constexpr Tolerance FlashMlaOutTolerance(double value_sigma) {
  return {kFlashMlaOutTolerance.abs_tol * value_sigma / 0.1, kFlashMlaOutTolerance.rel_tol,
          kFlashMlaOutTolerance.cos_tol};
}

// `round_to_bf16` applies the kernel's output cast before comparing.
::testing::AssertionResult AllClose(std::span<const float> actual, std::span<const double> expected,
                                    const Tolerance& tol, bool round_to_bf16);

// Same check between two kernels' outputs (both fp32, both rounded to bf16 first).
::testing::AssertionResult AllCloseF(std::span<const float> actual, std::span<const float> expected,
                                     const Tolerance& tol);

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_ATTENTION_CHECKS_H_
