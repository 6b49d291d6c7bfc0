#include "client/ctl/drain.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::ctl {
namespace {

cluster::MemberRecord Member(std::string address, int64_t budget, int64_t used) {
  cluster::MemberRecord m;
  m.instance_id = address;
  m.address = std::move(address);
  m.kv_budget_bytes = budget;
  m.kv_used_bytes = used;
  return m;
}

TEST(PlanDrainTest, APrefixsSequencesStayTogetherAndGroupsGoWhereTheRoomIs) {
  const std::vector<DrainedSequence> sequences = {
      {"a1", "sys", 300}, {"b", "", 200}, {"a2", "sys", 300}, {"c", "", 100}, {"a3", "sys", 300}};
  const std::vector<cluster::MemberRecord> targets = {Member("x:1", 2000, 500),
                                                      Member("y:1", 2000, 0)};
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> plan =
      PlanDrain(sequences, targets);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The prompt's group (900 bytes) first, to the roomiest (y: 2000 free); then b (200) to
  // y's 1100 vs x's 1500: x; then c (100): x has 1300, y 1100: x.
  EXPECT_THAT((*plan)["y:1"], ::testing::ElementsAre("a1", "a2", "a3"));
  EXPECT_THAT((*plan)["x:1"], ::testing::ElementsAre("b", "c"));
}

TEST(PlanDrainTest, AGroupNoServerHoldsIsResourceExhaustedNamingIt) {
  const std::vector<DrainedSequence> sequences = {{"a1", "sys", 600}, {"a2", "sys", 600}};
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> plan =
      PlanDrain(sequences, {Member("x:1", 1000, 0)});
  ASSERT_TRUE(absl::IsResourceExhausted(plan.status())) << plan.status();
  EXPECT_THAT(plan.status().message(), ::testing::HasSubstr("'a1'"));
  EXPECT_THAT(plan.status().message(), ::testing::HasSubstr("x:1"));
}

TEST(PlanDrainTest, WithoutTargetsThereIsNowhereToGo) {
  EXPECT_TRUE(absl::IsFailedPrecondition(PlanDrain({{"a", "", 1}}, {}).status()));
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> nothing = PlanDrain({}, {});
  ASSERT_TRUE(nothing.ok());
  EXPECT_TRUE(nothing->empty());
}

}  // namespace
}  // namespace mlaserve::ctl
