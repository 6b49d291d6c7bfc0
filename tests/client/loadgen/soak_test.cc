#include "client/loadgen/soak.h"

#include "gtest/gtest.h"

namespace mlaserve::loadgen {
namespace {

// --soak-max-rss-drift=auto: the 5 % gate only where the run can average the server's
// first-minutes growth out, 15 % for a short run (the documented one-minute example, make
// test's two minutes).
TEST(DefaultMaxRssDriftTest, TheTightGateNeedsALongRunAfterAFullWarmUp) {
  EXPECT_EQ(DefaultMaxRssDrift(600, 60), kLongRunMaxRssDrift);  // the soak's defaults
  EXPECT_EQ(DefaultMaxRssDrift(360, 60), kLongRunMaxRssDrift);
  EXPECT_EQ(DefaultMaxRssDrift(359, 60), kShortRunMaxRssDrift);   // 299 s measured
  EXPECT_EQ(DefaultMaxRssDrift(3600, 30), kShortRunMaxRssDrift);  // warm-up too short
  EXPECT_EQ(DefaultMaxRssDrift(60, 20), kShortRunMaxRssDrift);
  EXPECT_EQ(DefaultMaxRssDrift(30, 10), kShortRunMaxRssDrift);
  EXPECT_LT(kLongRunMaxRssDrift, kShortRunMaxRssDrift);
}

}  // namespace
}  // namespace mlaserve::loadgen
