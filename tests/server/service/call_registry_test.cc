#include "server/service/call_registry.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::service {
namespace {

using ::testing::HasSubstr;

class CountingStream final : public DrainableStream {
 public:
  void Drain() override { ++drains; }
  int drains = 0;
};

TEST(CallRegistryTest, EachClientHoldsAtMostItsLimitOfStreams) {
  CallRegistry registry(/*max_streams_per_client=*/2);
  CountingStream a1, a2, a3, b1;
  EXPECT_TRUE(registry.Add(&a1, "tenant a").ok());
  EXPECT_TRUE(registry.Add(&a2, "tenant a").ok());
  const absl::Status over = registry.Add(&a3, "tenant a");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("max_streams_per_client: tenant a already holds 2"));
  // Another client is not held to a's count.
  EXPECT_TRUE(registry.Add(&b1, "tenant b").ok());
  // A stream that ends gives its place back; removing one never added changes nothing.
  registry.Remove(&a3);
  EXPECT_EQ(registry.Add(&a3, "tenant a").code(), absl::StatusCode::kResourceExhausted);
  registry.Remove(&a1);
  EXPECT_TRUE(registry.Add(&a3, "tenant a").ok());
}

TEST(CallRegistryTest, ZeroMeansNoLimit) {
  CallRegistry registry(0);
  std::vector<CountingStream> streams(3000);
  for (CountingStream& stream : streams) EXPECT_TRUE(registry.Add(&stream, "one").ok());
}

TEST(CallRegistryTest, ADrainReachesEveryStreamAndRefusesNewOnesAsUnavailable) {
  CallRegistry registry(8);
  CountingStream a, b, late;
  ASSERT_TRUE(registry.Add(&a, "x").ok());
  ASSERT_TRUE(registry.Add(&b, "y").ok());
  EXPECT_FALSE(registry.WaitUntilIdle(absl::Now()));
  EXPECT_EQ(registry.DrainAll(), 2);
  EXPECT_EQ(a.drains, 1);
  EXPECT_EQ(b.drains, 1);
  EXPECT_EQ(registry.Add(&late, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(late.drains, 0);
  registry.Remove(&a);
  registry.Remove(&b);
  EXPECT_TRUE(registry.WaitUntilIdle(absl::Now() + absl::Seconds(1)));
}

}  // namespace
}  // namespace mlaserve::service
