#include "client/loadgen/rank_target.h"

#include <chrono>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/client/loadgen/fake_load_target.h"

namespace mlaserve::loadgen {
namespace {

TEST(RankTargetTest, ARanksSequencesGoToItsTargetAndPromptsToEveryOne) {
  std::vector<FakeTarget*> fakes;
  std::vector<std::unique_ptr<LoadTarget>> ranks;
  for (int r = 0; r < 3; ++r) {
    auto fake = std::make_unique<FakeTarget>(std::chrono::microseconds(0), /*mark=*/r);
    fakes.push_back(fake.get());
    ranks.push_back(std::move(fake));
  }
  RankTarget target(std::move(ranks));
  const std::vector<Bf16> prompt(static_cast<size_t>(FakeTarget::kLayers) * 4 * 8);
  ASSERT_TRUE(target.RegisterPrefix("run/system-prompt-0", prompt, 4, std::nullopt).ok());
  for (FakeTarget* fake : fakes) EXPECT_EQ(fake->prefixes_.count("run/system-prompt-0"), 1u);
  ASSERT_TRUE(target.CreateSequence("run/r2/q7", "run/system-prompt-0", std::nullopt).ok());
  ASSERT_TRUE(target.CreateSequence("run/w1/s3", "", std::nullopt).ok());
  EXPECT_EQ(fakes[2]->sequences_.count("run/r2/q7"), 1u);
  EXPECT_EQ(fakes[1]->sequences_.count("run/w1/s3"), 1u);
  EXPECT_EQ(fakes[0]->sequences_.size(), 0u);
  ASSERT_TRUE(target.ReleasePrefix("run/system-prompt-0").ok());
  for (FakeTarget* fake : fakes) EXPECT_EQ(fake->prefixes_.count("run/system-prompt-0"), 0u);
}

TEST(RankTargetTest, TheRankIsTheLastRankSegmentModuloTheRanks) {
  EXPECT_EQ(RankTarget::RankOf("loadgen/r1/q12", 4), 1);
  EXPECT_EQ(RankTarget::RankOf("loadgen/3/r5/q12", 4), 1);  // a sweep point's run id
  EXPECT_EQ(RankTarget::RankOf("loadgen/w2/s0", 4), 2);
  EXPECT_EQ(RankTarget::RankOf("req-42", 4), 0);
  EXPECT_EQ(RankTarget::RankOf("run/rx/q1", 4), 0);
}

}  // namespace
}  // namespace mlaserve::loadgen
