#include "cluster/placement.h"

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::cluster {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

PlacementCandidate Server(std::string id, int64_t budget, int64_t used, int prefix_group = -1,
                          int sequences = 0) {
  PlacementCandidate c;
  c.member.instance_id = std::move(id);
  c.member.kv_budget_bytes = budget;
  c.member.kv_used_bytes = used;
  c.member.sequences = sequences;
  c.prefix_group = prefix_group;
  return c;
}

PlacementRequest Sequence(bool prefix, int spread_group = 0) {
  PlacementRequest r;
  r.sequence_bytes = kGiB / 4;
  r.prefix_bytes = prefix ? kGiB / 2 : 0;
  r.has_prefix = prefix;
  r.spread_group = spread_group;
  return r;
}

TEST(PlaceSequenceTest, WithoutAPrefixTheServerWithTheMostFreeBytesWins) {
  const std::vector<PlacementCandidate> servers = {Server("a", 4 * kGiB, 3 * kGiB),
                                                   Server("b", 4 * kGiB, 1 * kGiB),
                                                   Server("c", 8 * kGiB, 6 * kGiB)};
  absl::StatusOr<Placement> placed = PlaceSequence(servers, Sequence(false));
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->instance_id, "b");
  EXPECT_FALSE(placed->register_prefix);
}

TEST(PlaceSequenceTest, TiesGoToFewerSequencesThenTheSmallerId) {
  std::vector<PlacementCandidate> servers = {Server("b", 4 * kGiB, kGiB, -1, 3),
                                             Server("a", 4 * kGiB, kGiB, -1, 5),
                                             Server("c", 4 * kGiB, kGiB, -1, 3)};
  EXPECT_EQ(PlaceSequence(servers, Sequence(false))->instance_id, "b");
  servers[1].member.sequences = 3;
  EXPECT_EQ(PlaceSequence(servers, Sequence(false))->instance_id, "a");
}

TEST(PlaceSequenceTest, ThisClientsReservationsCountAgainstTheRoom) {
  std::vector<PlacementCandidate> servers = {Server("a", 4 * kGiB, kGiB),
                                             Server("b", 4 * kGiB, 2 * kGiB)};
  servers[0].reserved_bytes = 2 * kGiB;  // a burst just placed there
  EXPECT_EQ(PlaceSequence(servers, Sequence(false))->instance_id, "b");
}

TEST(PlaceSequenceTest, APrefixsServerWinsWhileItHasRoomAndItsGroupIsSmall) {
  // b holds the prefix with less room than a: affinity first (TyphoonMLA needs the group).
  const std::vector<PlacementCandidate> servers = {Server("a", 8 * kGiB, 0),
                                                   Server("b", 4 * kGiB, 3 * kGiB, 5)};
  absl::StatusOr<Placement> placed = PlaceSequence(servers, Sequence(true, 16));
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->instance_id, "b");
  EXPECT_FALSE(placed->register_prefix);
}

TEST(PlaceSequenceTest, AmongHoldersTheSmallestGroupWins) {
  const std::vector<PlacementCandidate> servers = {
      Server("a", 8 * kGiB, 0, 9), Server("b", 8 * kGiB, 0, 4), Server("c", 8 * kGiB, 0)};
  EXPECT_EQ(PlaceSequence(servers, Sequence(true, 16))->instance_id, "b");
}

TEST(PlaceSequenceTest, AGroupAtTheSpreadSizeSendsTheNextSequenceToANewServerWithThePrefix) {
  const std::vector<PlacementCandidate> servers = {Server("a", 8 * kGiB, kGiB, 16),
                                                   Server("b", 8 * kGiB, 2 * kGiB),
                                                   Server("c", 8 * kGiB, 3 * kGiB)};
  absl::StatusOr<Placement> placed = PlaceSequence(servers, Sequence(true, 16));
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->instance_id, "b");
  EXPECT_TRUE(placed->register_prefix);
}

TEST(PlaceSequenceTest, ASpreadNeedsRoomForThePrefixToo) {
  // b has room for the sequence but not for the prefix's latent and expanded K/V as well.
  const std::vector<PlacementCandidate> servers = {
      Server("a", 8 * kGiB, kGiB, 16), Server("b", kGiB, kGiB / 2), Server("c", 8 * kGiB, 0, 16)};
  absl::StatusOr<Placement> placed = PlaceSequence(servers, Sequence(true, 16));
  ASSERT_TRUE(placed.ok()) << placed.status();
  // No server without the prefix has room: back to the holders; their groups are equal, so
  // the one with the most free bytes.
  EXPECT_EQ(placed->instance_id, "c");
  EXPECT_FALSE(placed->register_prefix);
}

TEST(PlaceSequenceTest, AFullHolderSendsTheSequenceElsewhereWithThePrefix) {
  const std::vector<PlacementCandidate> servers = {Server("a", 4 * kGiB, 4 * kGiB - 1, 2),
                                                   Server("b", 4 * kGiB, 0)};
  absl::StatusOr<Placement> placed = PlaceSequence(servers, Sequence(true, 0));
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->instance_id, "b");
  EXPECT_TRUE(placed->register_prefix);
}

TEST(PlaceSequenceTest, NearlyAsRoomyServersAreEqualAndEachClientOrdersThemItsOwnWay) {
  // 1 % apart: the same room. Without a seed the smaller id; with seeds, clients disagree.
  const std::vector<PlacementCandidate> servers = {Server("a", 100 * kGiB, kGiB),
                                                   Server("b", 100 * kGiB, 0),
                                                   Server("c", 100 * kGiB, 40 * kGiB)};
  EXPECT_EQ(PlaceSequence(servers, Sequence(false))->instance_id, "a");
  std::set<std::string> chosen;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    PlacementRequest request = Sequence(false);
    request.tie_break = seed;
    const std::string id = PlaceSequence(servers, request)->instance_id;
    EXPECT_NE(id, "c");  // 40 % fuller is not as roomy
    chosen.insert(id);
  }
  EXPECT_EQ(chosen, (std::set<std::string>{"a", "b"}));
}

TEST(PlaceSequenceTest, ExcludedServersAreNeverChosen) {
  const std::vector<PlacementCandidate> servers = {Server("a", 8 * kGiB, 0),
                                                   Server("b", 4 * kGiB, 0)};
  PlacementRequest request = Sequence(false);
  request.exclude = {"a"};
  EXPECT_EQ(PlaceSequence(servers, request)->instance_id, "b");
  request.exclude = {"a", "b"};
  EXPECT_TRUE(absl::IsResourceExhausted(PlaceSequence(servers, request).status()));
}

TEST(PlaceSequenceTest, NoRoomAnywhereIsResourceExhaustedNamingTheBytes) {
  const std::vector<PlacementCandidate> servers = {Server("a", kGiB, kGiB - 10),
                                                   Server("b", kGiB, kGiB)};
  absl::StatusOr<Placement> placed = PlaceSequence(servers, Sequence(false));
  ASSERT_TRUE(absl::IsResourceExhausted(placed.status())) << placed.status();
  EXPECT_THAT(placed.status().message(), ::testing::HasSubstr("268435456 bytes"));
  EXPECT_TRUE(absl::IsResourceExhausted(PlaceSequence({}, Sequence(false)).status()));
}

}  // namespace
}  // namespace mlaserve::cluster
