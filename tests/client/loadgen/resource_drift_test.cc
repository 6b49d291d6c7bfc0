#include "client/loadgen/resource_drift.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve::loadgen {
namespace {

TEST(ResourceDriftTest, DriftIsLastWindowMeanOverFirstWindowMean) {
  const std::vector<double> v{100, 102, 98, 100, 110, 130, 120};
  const Drift d = DriftOf(v, 3);
  EXPECT_DOUBLE_EQ(d.first, 100);  // (100 + 102 + 98) / 3
  EXPECT_DOUBLE_EQ(d.last, 120);   // (110 + 130 + 120) / 3
  EXPECT_DOUBLE_EQ(d.drift, 0.2);
}

TEST(ResourceDriftTest, ShrinkingIsNegativeAndFlatIsZero) {
  EXPECT_DOUBLE_EQ(DriftOf(std::vector<double>{200, 100}, 1).drift, -0.5);
  EXPECT_DOUBLE_EQ(DriftOf(std::vector<double>{7, 7, 7, 7}, 2).drift, 0);
}

TEST(ResourceDriftTest, WindowsOverlapOnShortSeriesAndZeroBaseHasNoScale) {
  const Drift d = DriftOf(std::vector<double>{10, 20}, 5);  // the window is the whole series
  EXPECT_DOUBLE_EQ(d.first, 15);
  EXPECT_DOUBLE_EQ(d.last, 15);
  EXPECT_DOUBLE_EQ(d.drift, 0);
  EXPECT_TRUE(std::isinf(DriftOf(std::vector<double>{0, 3}, 1).drift));
  EXPECT_DOUBLE_EQ(DriftOf(std::vector<double>{0, 0}, 1).drift, 0);
}

TEST(ResourceDriftTest, WarmUpSamplesAreLeftOutAndWindowIsATenth) {
  std::vector<ResourceSample> samples;
  // A steep warm-up (0-9 s), then 20 samples of a slow leak: 1000 + t bytes.
  for (int t = 0; t < 30; ++t) {
    samples.push_back(
        {static_cast<double>(t), t < 10 ? 10.0 * t : 1000.0 + t, t < 10 ? 1.0 : 20.0, 50.0});
  }
  absl::StatusOr<ResourceDrift> r = ComputeResourceDrift(samples, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->samples, 20);
  EXPECT_EQ(r->window, 2);
  EXPECT_DOUBLE_EQ(r->rss.first, 1010.5);  // t = 10, 11
  EXPECT_DOUBLE_EQ(r->rss.last, 1028.5);   // t = 28, 29
  EXPECT_DOUBLE_EQ(r->rss.drift, 18.0 / 1010.5);
  EXPECT_DOUBLE_EQ(r->threads.drift, 0);  // the warm-up's thread start is not a drift
  EXPECT_DOUBLE_EQ(r->open_fds.drift, 0);
}

TEST(ResourceDriftTest, KvPoolGrowthIsSetApartFromTheRestOfTheRss) {
  std::vector<ResourceSample> samples;
  // RSS grows by 40 bytes over the run; the KV pool's resident pages account for 30 of them.
  for (int t = 0; t < 10; ++t) {
    ResourceSample s{static_cast<double>(t), 1000.0 + 4 * t, 20, 50};
    s.kv_resident_bytes = 200.0 + 3 * t;
    samples.push_back(s);
  }
  absl::StatusOr<ResourceDrift> r = ComputeResourceDrift(samples, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->window, 1);
  EXPECT_DOUBLE_EQ(r->rss.drift, 36.0 / 1000.0);
  EXPECT_DOUBLE_EQ(r->kv_resident.first, 200.0);
  EXPECT_DOUBLE_EQ(r->kv_resident.last, 227.0);
  EXPECT_DOUBLE_EQ(r->rss_outside_kv.first, 800.0);
  EXPECT_DOUBLE_EQ(r->rss_outside_kv.last, 809.0);
  // Measured against the whole RSS, so the gate's percentage means the same as before.
  EXPECT_DOUBLE_EQ(r->rss_outside_kv.drift, 9.0 / 1000.0);
}

TEST(ResourceDriftTest, HeapInUseDriftOnlyWhenEverySampleAfterWarmUpHasIt) {
  std::vector<ResourceSample> samples;
  for (int t = 0; t < 10; ++t) {
    ResourceSample s{static_cast<double>(t), 1000, 20, 50};
    // Missing during the warm-up only.
    if (t >= 2) s.heap_in_use_bytes = 500.0 + 10 * t;
    samples.push_back(s);
  }
  absl::StatusOr<ResourceDrift> r = ComputeResourceDrift(samples, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->heap_in_use.has_value());
  EXPECT_DOUBLE_EQ(r->heap_in_use->first, 520.0);
  EXPECT_DOUBLE_EQ(r->heap_in_use->last, 590.0);
  EXPECT_DOUBLE_EQ(r->heap_in_use->drift, 70.0 / 520.0);
  r = ComputeResourceDrift(samples, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->heap_in_use.has_value());
}

TEST(ResourceDriftTest, TooFewSamplesAfterWarmUpIsAnErrorNamingTheFlags) {
  const std::vector<ResourceSample> samples{{0, 1, 1, 1}, {5, 1, 1, 1}, {10, 1, 1, 1}};
  absl::StatusOr<ResourceDrift> r = ComputeResourceDrift(samples, 8);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("--soak-warmup-s"), std::string::npos);
  EXPECT_TRUE(ComputeResourceDrift(samples, 5).ok());
}

}  // namespace
}  // namespace mlaserve::loadgen
