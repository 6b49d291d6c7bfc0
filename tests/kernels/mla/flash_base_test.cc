#include "kernels/mla/flash_base.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/reference/golden_attention.h"
#include "tests/testing/attention_checks.h"
#include "tests/testing/kernel_sweep.h"
#include "tests/testing/random_batch.h"

namespace mlaserve {
namespace {

using testing::SweepPoint;

class FlashBaseSweepTest : public ::testing::TestWithParam<SweepPoint> {};

TEST_P(FlashBaseSweepTest, MatchesGoldenWithinFlashMlaTolerances) {
  const SweepPoint p = GetParam();
  Rng rng(100 + p.heads * 7 + p.sq * 3 + p.page_size);
  const auto batch = testing::MakeRandomPagedBatch({.sq = p.sq,
                                                    .heads = p.heads,
                                                    .dk = 576,
                                                    .page_size = p.page_size,
                                                    .seqlens = testing::SweepLengths(p.page_size),
                                                    .q_sigma = p.sigma,
                                                    .kv_sigma = p.sigma},
                                                   rng);
  const LatentDecodeProblem problem = batch.Latent(512, 1.0f / std::sqrt(576.0f));
  auto golden = GoldenLatentDecode(problem);
  auto base = FlashBaseDecode(problem);
  ASSERT_TRUE(golden.ok()) << golden.status();
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_TRUE(
      testing::AllClose(base->out, golden->out, testing::FlashMlaOutTolerance(p.sigma), true));
  EXPECT_TRUE(testing::AllClose(base->lse, golden->lse, testing::kFlashMlaLseTolerance, false));
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashBaseSweepTest, ::testing::ValuesIn(testing::KernelSweep()),
                         testing::SweepName);

}  // namespace
}  // namespace mlaserve
