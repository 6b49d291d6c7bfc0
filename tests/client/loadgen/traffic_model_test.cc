#include "client/loadgen/traffic_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve::loadgen {
namespace {

struct Moments {
  double mean = 0;
  double cv = 0;  // standard deviation / mean
};

Moments MomentsOf(const std::vector<double>& x) {
  const double mean = std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(x.size());
  double var = 0;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= static_cast<double>(x.size() - 1);
  return {mean, std::sqrt(var) / mean};
}

std::vector<double> Gaps(const ArrivalProcess& p, int n, uint64_t seed) {
  TrafficRng rng(seed);
  std::vector<double> gaps(n);
  for (double& g : gaps) g = p.NextGap(rng);
  return gaps;
}

// A Gamma(k, 1/(rate k)) gap has mean 1/rate and coefficient of variation 1/sqrt(k); with
// n = 40000 draws the sample mean's relative standard error is cv/sqrt(n) (1 % at k = 0.25),
// so the tolerances below are over four standard errors.
TEST(ArrivalProcessTest, PoissonGapsHaveTheRateAndUnitVariation) {
  absl::StatusOr<ArrivalProcess> p = ArrivalProcess::Create(50, 1);
  ASSERT_TRUE(p.ok()) << p.status();
  const Moments m = MomentsOf(Gaps(*p, 40000, 3));
  EXPECT_NEAR(m.mean, 1.0 / 50, 0.02 / 50);
  EXPECT_NEAR(m.cv, 1.0, 0.03);
  // Memorylessness, the mark of an exponential: P(gap > 2/rate) = e^-2.
  TrafficRng rng(4);
  int over = 0;
  for (int i = 0; i < 40000; ++i) over += p->NextGap(rng) > 2.0 / 50;
  EXPECT_NEAR(over / 40000.0, std::exp(-2.0), 0.01);
}

TEST(ArrivalProcessTest, BurstinessKeepsTheRateAndScalesTheVariation) {
  for (double k : {0.25, 4.0}) {
    absl::StatusOr<ArrivalProcess> p = ArrivalProcess::Create(10, k);
    ASSERT_TRUE(p.ok()) << p.status();
    const Moments m = MomentsOf(Gaps(*p, 40000, 5));
    EXPECT_NEAR(m.mean, 0.1, 0.1 * 0.05) << k;
    EXPECT_NEAR(m.cv, 1 / std::sqrt(k), 0.06 / std::sqrt(k)) << k;
  }
}

TEST(ArrivalProcessTest, BadRatesAndBurstinessNameTheirFlag) {
  EXPECT_TRUE(ArrivalProcess::Create(0, 1).ok());
  EXPECT_FALSE(ArrivalProcess::Create(0, 1)->open_loop());
  for (double rate : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    absl::StatusOr<ArrivalProcess> p = ArrivalProcess::Create(rate, 1);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("--arrival-rate"), std::string::npos);
  }
  for (double k : {0.0, -2.0, std::nan("")}) {
    absl::StatusOr<ArrivalProcess> p = ArrivalProcess::Create(1, k);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("--burstiness"), std::string::npos);
  }
}

std::vector<int> Draws(const LengthDistribution& d, int n, uint64_t seed) {
  TrafficRng rng(seed);
  std::vector<int> out(n);
  for (int& v : out) v = d.Draw(rng);
  return out;
}

TEST(LengthDistributionTest, FixedAndUniformDrawWhatTheySay) {
  absl::StatusOr<LengthDistribution> fixed = LengthDistribution::Parse("fixed:77", "x", 1000);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  for (int v : Draws(*fixed, 100, 1)) ASSERT_EQ(v, 77);

  absl::StatusOr<LengthDistribution> uniform = LengthDistribution::Parse("uniform:3,12", "x", 1000);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  std::map<int, int> counts;
  const std::vector<int> draws = Draws(*uniform, 50000, 2);
  for (int v : draws) ++counts[v];
  ASSERT_EQ(counts.size(), 10u);  // every value of [3, 12], nothing else
  EXPECT_EQ(counts.begin()->first, 3);
  EXPECT_EQ(counts.rbegin()->first, 12);
  // Each value's count is Binomial(50000, 0.1): standard deviation 67.
  for (const auto& [value, n] : counts) EXPECT_NEAR(n, 5000, 300) << value;
}

TEST(LengthDistributionTest, LogNormalHasItsMedianAndSpread) {
  absl::StatusOr<LengthDistribution> d =
      LengthDistribution::Parse("lognormal:500,0.8", "x", 1 << 20);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<int> draws = Draws(*d, 40000, 3);
  std::sort(draws.begin(), draws.end());
  EXPECT_NEAR(draws[draws.size() / 2], 500, 15);
  // ln X ~ N(ln 500, 0.8^2): P(X <= 500 e^0.8) = Phi(1) = 0.8413.
  const double below =
      std::upper_bound(draws.begin(), draws.end(), 500 * std::exp(0.8)) - draws.begin();
  EXPECT_NEAR(below / draws.size(), 0.8413, 0.01);
}

TEST(LengthDistributionTest, ALogNormalWithoutSpreadIsItsMedian) {
  absl::StatusOr<LengthDistribution> d = LengthDistribution::Parse("lognormal:42,0", "x", 100);
  ASSERT_TRUE(d.ok()) << d.status();
  for (int v : Draws(*d, 100, 7)) ASSERT_EQ(v, 42);
}

TEST(LengthDistributionTest, DrawsAreClampedToTheLimit) {
  absl::StatusOr<LengthDistribution> d = LengthDistribution::Parse("lognormal:100,3", "x", 400);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::vector<int> draws = Draws(*d, 10000, 4);
  EXPECT_EQ(*std::max_element(draws.begin(), draws.end()), 400);
  EXPECT_GE(*std::min_element(draws.begin(), draws.end()), 1);
}

TEST(LengthDistributionTest, AFileOfLengthsIsDrawnFromAsWritten) {
  const std::string path = testing::TempDir() + "/traffic_model_test_lengths.txt";
  {
    std::ofstream out(path);
    out << "# a trace\n10\n\n20\n20\n30\n";
  }
  absl::StatusOr<LengthDistribution> d = LengthDistribution::Parse("file:" + path, "x", 100);
  std::remove(path.c_str());
  ASSERT_TRUE(d.ok()) << d.status();
  std::map<int, int> counts;
  for (int v : Draws(*d, 40000, 5)) ++counts[v];
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_NEAR(counts[10], 10000, 400);
  EXPECT_NEAR(counts[20], 20000, 400);
  EXPECT_NEAR(counts[30], 10000, 400);
}

TEST(LengthDistributionTest, BadSpecsNameTheFlagAndSayWhy) {
  const std::string missing = testing::TempDir() + "/traffic_model_test_no_such_file";
  for (const std::string& spec :
       {std::string("fixed:0"), std::string("fixed:x"), std::string("uniform:5,2"),
        std::string("uniform:5"), std::string("lognormal:0.5,1"), std::string("lognormal:10,-1"),
        std::string("zipf:3"), std::string(""), "file:" + missing, std::string("fixed:900"),
        std::string("uniform:1,900")}) {
    absl::StatusOr<LengthDistribution> d = LengthDistribution::Parse(spec, "context-dist", 500);
    ASSERT_FALSE(d.ok()) << spec;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("--context-dist"), std::string::npos) << spec;
  }
}

TEST(PromptMixTest, SequencesSplitAcrossPromptsByWeight) {
  absl::StatusOr<PromptMix> mix = PromptMix::Parse("1024:3,2048:1");
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_EQ(mix->tokens, (std::vector<int>{1024, 2048}));
  TrafficRng rng(6);
  int first = 0;
  for (int i = 0; i < 40000; ++i) first += mix->Draw(rng) == 0;
  EXPECT_NEAR(first / 40000.0, 0.75, 0.01);  // standard error 0.002

  absl::StatusOr<PromptMix> one = PromptMix::Parse("512");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->Draw(rng), 0);
  for (const char* none : {"", "0"}) {
    absl::StatusOr<PromptMix> empty = PromptMix::Parse(none);
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(empty->Draw(rng), -1);
  }
  for (const char* bad : {"x", "100:0", "100:-1", "-5:1", "100:y"}) {
    absl::StatusOr<PromptMix> m = PromptMix::Parse(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_NE(m.status().message().find("--system-prompts"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace mlaserve::loadgen
