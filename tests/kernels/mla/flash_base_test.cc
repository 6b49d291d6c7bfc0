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
  testing::ExpectSweepPointMatchesGolden(
      GetParam(), 100, [](const LatentDecodeProblem& problem) { return FlashBaseDecode(problem); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashBaseSweepTest, ::testing::ValuesIn(testing::KernelSweep()),
                         testing::SweepName);

}  // namespace
}  // namespace mlaserve
