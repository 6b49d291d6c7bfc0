#ifndef MLASERVE_TESTS_TESTING_KERNEL_SWEEP_H_
#define MLASERVE_TESTS_TESTING_KERNEL_SWEEP_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/core/random_fill.h"
#include "kernels/reference/golden_attention.h"
#include "tests/testing/attention_checks.h"
#include "tests/testing/random_batch.h"

namespace mlaserve::testing {

// The shape sweep every latent kernel must pass (issue "Foundation"): heads x Sq x page
// size, each batch holding the awkward lengths: empty, 1, page boundary +-1, not a multiple
// of the 512-token block, and longer than one block. Data comes in two regimes: FlashMLA's
// own recipe (sigma 0.1, near-uniform softmax) and sigma 1 (peaked softmax whose running
// max moves between blocks, which is what exercises the rescaling).
struct SweepPoint {
  int heads;
  int sq;
  int page_size;
  double sigma;
};

inline std::vector<SweepPoint> KernelSweep() {
  std::vector<SweepPoint> points;
  for (double sigma : {0.1, 1.0})
    for (int heads : {1, 16, 64, 128})
      for (int sq : {1, 2, 4})
        for (int page_size : {64, 128}) points.push_back({heads, sq, page_size, sigma});
  return points;
}

inline std::vector<int32_t> SweepLengths(int page_size) {
  return {0, 1, page_size - 1, page_size, page_size + 1, 511, 513, 700, 1300};
}

inline std::string SweepName(const ::testing::TestParamInfo<SweepPoint>& info) {
  return absl::StrCat("h", info.param.heads, "_sq", info.param.sq, "_page", info.param.page_size,
                      info.param.sigma < 0.5 ? "_flashmla_data" : "_unit_sigma");
}

// One sweep point for a latent kernel (`kernel(problem)` -> StatusOr of out and lse): fresh
// random data from `seed`, the kernel's answers against the fp64 golden within FlashMLA's
// tolerances.
template <typename Kernel>
void ExpectSweepPointMatchesGolden(const SweepPoint& p, uint64_t seed, Kernel kernel) {
  Rng rng(seed + p.heads * 7 + p.sq * 3 + p.page_size);
  const auto batch = MakeRandomPagedBatch({.sq = p.sq,
                                           .heads = p.heads,
                                           .dk = 576,
                                           .page_size = p.page_size,
                                           .seqlens = SweepLengths(p.page_size),
                                           .q_sigma = p.sigma,
                                           .kv_sigma = p.sigma},
                                          rng);
  const LatentDecodeProblem problem = batch.Latent(512, 1.0f / std::sqrt(576.0f));
  auto golden = GoldenLatentDecode(problem);
  auto actual = kernel(problem);
  ASSERT_TRUE(golden.ok()) << golden.status();
  ASSERT_TRUE(actual.ok()) << actual.status();
  EXPECT_TRUE(AllClose(actual->out, golden->out, FlashMlaOutTolerance(p.sigma), true));
  EXPECT_TRUE(AllClose(actual->lse, golden->lse, kFlashMlaLseTolerance, false));
}

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_KERNEL_SWEEP_H_
