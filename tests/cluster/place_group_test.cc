// PlaceGroup, case by case: the load bound, prefix holders first, the rendezvous order, the
// least loaded when none is within the bound, room; and many groups placed one after another
// as GroupTable's compare-and-swap serialises clients placing at once.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::cluster {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

PlacementCandidate Roomy(std::string id, int64_t group_load = 0, int prefix_group = -1) {
  PlacementCandidate c;
  c.member.instance_id = std::move(id);
  c.member.kv_budget_bytes = 1024 * kMiB;
  c.group_load = group_load;
  c.group_bytes = group_load * kMiB;
  c.prefix_group = prefix_group;
  return c;
}

PlacementRequest FirstSequence(bool prefix) {
  PlacementRequest r;
  r.sequence_bytes = kMiB;
  r.has_prefix = prefix;
  r.prefix_bytes = prefix ? 4 * kMiB : 0;
  return r;
}

GroupRequest Group(std::string name, int64_t weight) {
  GroupRequest g;
  g.group = std::move(name);
  g.weight = weight;
  g.bytes = weight * kMiB;
  return g;
}

// The server a group goes to among equally loaded empty servers, by its name alone.
std::string FirstChoice(const std::string& group, const std::vector<std::string>& ids) {
  std::vector<PlacementCandidate> servers;
  for (const std::string& id : ids) servers.push_back(Roomy(id));
  return PlaceGroup(servers, FirstSequence(false), Group(group, 1))->instance_id;
}

TEST(PlaceGroupTest, OneGroupsOrderIsTheSameWhateverTheCandidatesOrderAndGroupsSpread) {
  const std::vector<std::string> ids = {"a", "b", "c"};
  const std::vector<std::string> reversed = {"c", "b", "a"};
  std::map<std::string, int> firsts;
  for (int g = 0; g < 60; ++g) {
    const std::string name = absl::StrCat("client/rank", g);
    const std::string chosen = FirstChoice(name, ids);
    EXPECT_EQ(chosen, FirstChoice(name, reversed)) << name;
    ++firsts[chosen];
  }
  // 60 names over 3 servers: each server first for some (a fixed order would give one all).
  EXPECT_EQ(firsts.size(), 3u);
  for (const auto& [id, count] : firsts) EXPECT_GE(count, 8) << id;
}

TEST(PlaceGroupTest, AServerThatWouldPassTheBoundIsPassedOver) {
  // Mean after: (195 + 65) / 3 = 86.7, bound ceil(1.15 * 86.7) = 100: "a" at 130 + 65 and "b"
  // at 65 + 65 would pass it; "c" at 0 takes it whatever the group's own order.
  const std::vector<PlacementCandidate> servers = {Roomy("a", 130), Roomy("b", 65), Roomy("c", 0)};
  for (int g = 0; g < 20; ++g) {
    EXPECT_EQ(
        PlaceGroup(servers, FirstSequence(false), Group(absl::StrCat("g", g), 65))->instance_id,
        "c");
  }
}

TEST(PlaceGroupTest, AGroupLargerThanTheMeanStillGoesToAServerAtOrBelowIt) {
  // Loads 10 / 10 / 40, a group of 100: no server is within ceil(1.15 * 160 / 3) = 62; the
  // least loaded, "a" or "b" by the group's order, takes it, never "c".
  const std::vector<PlacementCandidate> servers = {Roomy("a", 10), Roomy("b", 10), Roomy("c", 40)};
  for (int g = 0; g < 20; ++g) {
    const std::string chosen =
        PlaceGroup(servers, FirstSequence(false), Group(absl::StrCat("g", g), 100))->instance_id;
    EXPECT_NE(chosen, "c");
  }
}

TEST(PlaceGroupTest, AHolderOfThePrefixWinsWhileItIsWithinTheBound) {
  std::vector<PlacementCandidate> servers = {Roomy("a", 0), Roomy("b", 0, /*prefix_group=*/3),
                                             Roomy("c", 0)};
  for (int g = 0; g < 20; ++g) {
    absl::StatusOr<Placement> placed =
        PlaceGroup(servers, FirstSequence(true), Group(absl::StrCat("g", g), 65));
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_EQ(placed->instance_id, "b");
    EXPECT_FALSE(placed->register_prefix);
  }
  // Past the bound the holder loses; the prefix is then registered where the group goes.
  servers[1].group_load = 65;
  servers[1].group_bytes = 65 * kMiB;
  absl::StatusOr<Placement> placed = PlaceGroup(servers, FirstSequence(true), Group("g", 65));
  ASSERT_TRUE(placed.ok());
  EXPECT_NE(placed->instance_id, "b");
  EXPECT_TRUE(placed->register_prefix);
}

TEST(PlaceGroupTest, TheBytesBoundHoldsAsTheQueriesBoundDoes) {
  // Equal queries, but "a" holds most of the bytes: a group goes elsewhere.
  std::vector<PlacementCandidate> servers = {Roomy("a", 10), Roomy("b", 10)};
  servers[0].group_bytes = 500 * kMiB;
  servers[1].group_bytes = 10 * kMiB;
  GroupRequest group = Group("g", 10);
  group.bytes = 100 * kMiB;
  for (int g = 0; g < 10; ++g) {
    group.group = absl::StrCat("g", g);
    EXPECT_EQ(PlaceGroup(servers, FirstSequence(false), group)->instance_id, "b");
  }
}

TEST(PlaceGroupTest, WithNoRoomAnywhereItSaysHowMuchWasNeeded) {
  std::vector<PlacementCandidate> servers = {Roomy("a"), Roomy("b")};
  for (PlacementCandidate& c : servers) c.member.kv_used_bytes = c.member.kv_budget_bytes;
  absl::StatusOr<Placement> placed = PlaceGroup(servers, FirstSequence(false), Group("g", 1));
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(placed.status().message(), ::testing::HasSubstr("1048576 bytes"));
  // A server without room is not chosen even when it is the least loaded.
  servers[1].member.kv_used_bytes = 0;
  servers[0].member.kv_used_bytes = servers[0].member.kv_budget_bytes;
  servers[1].group_load = 1000;
  EXPECT_EQ(PlaceGroup(servers, FirstSequence(false), Group("g", 1))->instance_id, "b");
}

TEST(PlaceGroupTest, ExcludedServersNeitherTakeTheGroupNorCountInTheMean) {
  std::vector<PlacementCandidate> servers = {Roomy("a", 0), Roomy("b", 0), Roomy("c", 0)};
  PlacementRequest request = FirstSequence(false);
  request.exclude = {"a", "c"};
  EXPECT_EQ(PlaceGroup(servers, request, Group("g", 5))->instance_id, "b");
}

// Groups placed one after another, each seeing the ones before (as the claims in etcd show
// them): the busiest server within the bound of the mean.
struct Spread {
  std::map<std::string, int64_t> load;
  int64_t busiest() const {
    int64_t most = 0;
    for (const auto& [id, l] : load) most = std::max(most, l);
    return most;
  }
};

Spread PlaceAll(int servers, const std::vector<int64_t>& weights) {
  std::vector<PlacementCandidate> candidates;
  Spread spread;
  for (int s = 0; s < servers; ++s) {
    candidates.push_back(Roomy(absl::StrCat("server-", s)));
    spread.load[candidates.back().member.instance_id] = 0;
  }
  for (size_t g = 0; g < weights.size(); ++g) {
    for (PlacementCandidate& c : candidates) {
      c.group_load = spread.load[c.member.instance_id];
      c.group_bytes = c.group_load * kMiB;
    }
    absl::StatusOr<Placement> placed =
        PlaceGroup(candidates, FirstSequence(false),
                   Group(absl::StrCat("client-", g % 7, "/rank", g), weights[g]));
    EXPECT_TRUE(placed.ok()) << placed.status();
    if (placed.ok()) spread.load[placed->instance_id] += weights[g];
  }
  return spread;
}

TEST(PlaceGroupTest, EqualGroupsFillEveryServerEvenly) {
  for (int servers : {2, 3, 4}) {
    for (int per_server : {1, 2, 3}) {
      const Spread spread = PlaceAll(servers, std::vector<int64_t>(servers * per_server, 72));
      for (const auto& [id, load] : spread.load) {
        EXPECT_EQ(load, 72 * per_server)
            << servers << " servers, " << per_server << " groups each, " << id;
      }
    }
  }
}

TEST(PlaceGroupTest, UnequalGroupsKeepTheBusiestWithinTheBoundOrOneGroupOfTheMean) {
  std::vector<int64_t> weights;
  for (int g = 0; g < 30; ++g) weights.push_back(1 + (g * 37) % 23);
  const Spread spread = PlaceAll(3, weights);
  int64_t total = 0;
  for (int64_t w : weights) total += w;
  const double mean = static_cast<double>(total) / 3;
  EXPECT_LE(static_cast<double>(spread.busiest()), 1.15 * mean + 23) << "mean " << mean;
}

}  // namespace
}  // namespace mlaserve::cluster
