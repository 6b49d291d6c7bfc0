// The AMLA paper's central accuracy claim, checked on the paper's own protocol: on every
// input distribution of Tables 3 and 4, AMLA's error against the fp64 golden is within 5%
// of Base's. If this fails the implementation is wrong, not the claim.
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/mla/accuracy_protocol.h"
#include "kernels/mla/amla.h"
#include "kernels/mla/flash_base.h"

namespace mlaserve {
namespace {

class AmlaAccuracyTest : public ::testing::TestWithParam<AccuracyCase> {};

TEST_P(AmlaAccuracyTest, AmlaErrorWithinFivePercentOfBase) {
  const std::vector<NamedKernel> kernels = {
      {"base", FlashBaseDecode},
      {"amla", [](const LatentDecodeProblem& p) { return AmlaDecode(p); }},
  };
  // Two fresh seeds per case (the benchmark runs the full five).
  auto errors =
      MeasureAccuracy(GetParam(), /*seeds=*/2, kernels, AccuracyShape{}, /*base_seed=*/77);
  ASSERT_TRUE(errors.ok()) << errors.status();
  const double base = (*errors)[0], amla = (*errors)[1];
  EXPECT_GT(base, 0.0);
  EXPECT_LE(amla, 1.05 * base) << "base " << base << " amla " << amla;
}

INSTANTIATE_TEST_SUITE_P(PaperDistributions, AmlaAccuracyTest,
                         ::testing::ValuesIn(PaperAccuracyCases()),
                         [](const ::testing::TestParamInfo<AccuracyCase>& param_info) {
                           return absl::StrCat(DistributionName(param_info.param.distribution), "_",
                                               static_cast<int>(param_info.param.param));
                         });

}  // namespace
}  // namespace mlaserve
