// GroupTable against a real etcd (Debian's, on loopback, removed after): many clients placing
// groups at once end evenly spread, a claim's updates and drops show in every client's loads,
// and a client's claims go with it.
#include "cluster/group_table.h"

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_process.h"

namespace mlaserve::cluster {
namespace {

constexpr char kCluster[] = "group-table-test";
const std::vector<std::string> kServers = {"server-a", "server-b", "server-c"};

std::unique_ptr<GroupTable> Table(const testing::EtcdProcess& etcd) {
  absl::StatusOr<std::unique_ptr<GroupTable>> table = GroupTable::Start(etcd.Client(), kCluster);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? *std::move(table) : nullptr;
}

// PlaceGroup over kServers, each with room, loaded as the claims say.
GroupTable::Chooser Bounded(const std::string& group, int64_t weight) {
  return [group, weight](const GroupLoads& loads) -> absl::StatusOr<std::string> {
    std::vector<PlacementCandidate> candidates;
    for (const std::string& id : kServers) {
      PlacementCandidate c;
      c.member.instance_id = id;
      c.member.kv_budget_bytes = int64_t{1} << 40;
      auto load = loads.find(id);
      if (load != loads.end()) {
        c.group_load = load->second.weight;
        c.group_bytes = load->second.bytes;
      }
      candidates.push_back(std::move(c));
    }
    PlacementRequest request;
    request.sequence_bytes = 1;
    GroupRequest wanted;
    wanted.group = group;
    wanted.weight = weight;
    wanted.bytes = weight;
    absl::StatusOr<Placement> placed = PlaceGroup(candidates, request, wanted);
    if (!placed.ok()) return placed.status();
    return placed->instance_id;
  };
}

class GroupTableTest : public ::testing::Test {
 protected:
  testing::EtcdProcess etcd_{MLASERVE_ETCD_BINARY};
};

TEST_F(GroupTableTest, TwelveClientsPlacingAtOnceEndFourGroupsOnEachOfThreeServers) {
  constexpr int kClients = 12;
  std::vector<std::unique_ptr<GroupTable>> tables;
  for (int c = 0; c < kClients; ++c) tables.push_back(Table(etcd_));
  std::vector<absl::StatusOr<std::string>> chosen(kClients, absl::UnknownError("not run"));
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      const std::string group = absl::StrCat("prompt|rank", c, "#0");
      chosen[c] = tables[c]->Claim(group, 72, 72,
                                   Bounded(absl::StrCat(tables[c]->client_id(), "/", group), 72));
    });
  }
  for (std::thread& t : clients) t.join();
  std::map<std::string, int> groups;
  int64_t contended = 0;
  for (int c = 0; c < kClients; ++c) {
    ASSERT_TRUE(chosen[c].ok()) << chosen[c].status();
    ++groups[*chosen[c]];
    contended += tables[c]->contended();
  }
  for (const std::string& id : kServers) EXPECT_EQ(groups[id], 4) << id;
  // What every client now reads agrees with what they chose.
  absl::StatusOr<GroupLoads> loads = tables[0]->Loads();
  ASSERT_TRUE(loads.ok()) << loads.status();
  for (const std::string& id : kServers) EXPECT_EQ((*loads)[id].weight, 4 * 72) << id;
  RecordProperty("contended_rounds", static_cast<int>(contended));
}

TEST_F(GroupTableTest, UpdatesAndDropsShowInEveryClientsLoads) {
  std::unique_ptr<GroupTable> mine = Table(etcd_);
  std::unique_ptr<GroupTable> other = Table(etcd_);
  auto on_b = [](const GroupLoads&) -> absl::StatusOr<std::string> { return "server-b"; };
  ASSERT_TRUE(mine->Claim("g#0", 65, 650, on_b).ok());
  EXPECT_EQ((*other->Loads())["server-b"].weight, 65);
  ASSERT_TRUE(mine->Update("g#0", 80, 800).ok());
  EXPECT_EQ((*other->Loads())["server-b"].weight, 80);
  EXPECT_EQ((*other->Loads())["server-b"].bytes, 800);
  EXPECT_EQ(mine->Update("never-claimed", 1, 1).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(mine->Drop("g#0").ok());
  EXPECT_FALSE(other->Loads()->contains("server-b"));
}

TEST_F(GroupTableTest, AGroupClaimedAgainDoesNotSeeItsOwnEarlierClaim) {
  std::unique_ptr<GroupTable> table = Table(etcd_);
  auto on_a = [](const GroupLoads&) -> absl::StatusOr<std::string> { return "server-a"; };
  ASSERT_TRUE(table->Claim("g#0", 10, 10, on_a).ok());
  GroupLoads seen;
  auto record = [&seen](const GroupLoads& loads) -> absl::StatusOr<std::string> {
    seen = loads;
    return "server-c";
  };
  ASSERT_TRUE(table->Claim("g#0", 10, 10, record).ok());
  EXPECT_FALSE(seen.contains("server-a"));
  EXPECT_EQ((*table->Loads())["server-c"].weight, 10);
  EXPECT_FALSE(table->Loads()->contains("server-a"));
}

TEST_F(GroupTableTest, AClientsClaimsGoWithItAndAChoosersErrorWritesNothing) {
  std::unique_ptr<GroupTable> staying = Table(etcd_);
  {
    std::unique_ptr<GroupTable> leaving = Table(etcd_);
    auto on_a = [](const GroupLoads&) -> absl::StatusOr<std::string> { return "server-a"; };
    ASSERT_TRUE(leaving->Claim("g#0", 7, 7, on_a).ok());
    EXPECT_EQ((*staying->Loads())["server-a"].weight, 7);
    auto full = [](const GroupLoads&) -> absl::StatusOr<std::string> {
      return absl::ResourceExhaustedError("no room");
    };
    EXPECT_EQ(leaving->Claim("g#1", 7, 7, full).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  EXPECT_TRUE(staying->Loads()->empty());
}

TEST(GroupClaimTest, ARecordThatIsNotAClaimIsRefusedNamingTheField) {
  EXPECT_THAT(ParseGroupClaim("[]").status().message(), ::testing::HasSubstr("not a JSON object"));
  EXPECT_THAT(ParseGroupClaim(R"({"weight":1,"bytes":1})").status().message(),
              ::testing::HasSubstr("instance_id"));
  EXPECT_THAT(ParseGroupClaim(R"({"instance_id":"a","weight":-1,"bytes":1})").status().message(),
              ::testing::HasSubstr("weight"));
  EXPECT_THAT(ParseGroupClaim(R"({"instance_id":"a","weight":1})").status().message(),
              ::testing::HasSubstr("bytes"));
  const GroupClaim claim{"a", 3, 4};
  absl::StatusOr<GroupClaim> parsed = ParseGroupClaim(claim.ToJson());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->instance_id, "a");
  EXPECT_EQ(parsed->weight, 3);
  EXPECT_EQ(parsed->bytes, 4);
}

}  // namespace
}  // namespace mlaserve::cluster
