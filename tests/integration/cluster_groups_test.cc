// Placement groups through the C++ cluster client, against a real etcd and three real servers
// (docs/cluster.md, "Placement groups"): ranks placing at once, each with its own client or
// all through one, end two ranks a server with each rank's sequences on one server; a group's
// claim follows its sequences.
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/cluster_client_fixture.h"

namespace mlaserve::integration {
namespace {

constexpr int kRanks = 6;
constexpr int kPerRank = 4;

class ClusterGroupsTest : public ClusterClientTest {
 protected:
  client::ClusterOptions GroupOptions() const {
    client::ClusterOptions options = Options();
    options.spread_group = 100;  // a rank's group is never spread here
    return options;
  }

  v1::Tensor Prompt() {
    const engine::ModelConfig model = TinyModel();
    const int width = model.dk_latent();
    if (prompt_.empty()) {
      prompt_ = RandomBf16(static_cast<size_t>(model.layers) * 16 * width, 1.0, rng_);
    }
    return Tensor3(prompt_, model.layers, 16, width);
  }

  // The server each rank's sequences are on (failing when a rank's are on several), and how
  // many ranks each server holds.
  std::map<std::string, int> RanksPerServer(
      const std::vector<client::ClusterClient*>& client_of_rank) {
    std::map<std::string, int> ranks;
    for (int r = 0; r < kRanks; ++r) {
      std::set<std::string> servers;
      for (int s = 0; s < kPerRank; ++s) {
        absl::StatusOr<std::vector<std::string>> on =
            client_of_rank[r]->ServersOf(absl::StrCat("run/r", r, "/s", s));
        EXPECT_TRUE(on.ok()) << on.status();
        if (on.ok()) servers.insert(on->front());
      }
      EXPECT_EQ(servers.size(), 1u) << "rank " << r << " split over servers";
      if (!servers.empty()) ++ranks[*servers.begin()];
    }
    return ranks;
  }

  std::vector<Bf16> prompt_;
};

TEST_F(ClusterGroupsTest, RanksWithAClientEachPlacingAtOnceEndTwoOnEveryServerEachWhole) {
  std::vector<std::unique_ptr<client::ClusterClient>> clients;
  for (int r = 0; r < kRanks; ++r) {
    clients.push_back(Connect(GroupOptions()));
    ASSERT_NE(clients.back(), nullptr);
    ASSERT_NE(clients.back()->group_table(), nullptr);
  }
  const v1::Tensor prompt = Prompt();
  std::vector<absl::Status> failed(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      absl::Status status = clients[r]->RegisterPrefix("system", "", prompt);
      for (int s = 0; s < kPerRank && status.ok(); ++s) {
        status = clients[r]
                     ->CreateSequence(absl::StrCat("run/r", r, "/s", s), "system",
                                      v1::KV_DTYPE_UNSPECIFIED, "rank")
                     .status();
      }
      failed[r] = status;
    });
  }
  for (std::thread& t : ranks) t.join();
  for (const absl::Status& status : failed) ASSERT_TRUE(status.ok()) << status;
  std::vector<client::ClusterClient*> client_of_rank;
  for (const auto& c : clients) client_of_rank.push_back(c.get());
  const std::map<std::string, int> ranks_per_server = RanksPerServer(client_of_rank);
  ASSERT_EQ(ranks_per_server.size(), members_.size());
  for (const auto& [server, count] : ranks_per_server) EXPECT_EQ(count, 2) << server;
  // Every client reads the same claims: six groups, two a server.
  absl::StatusOr<cluster::GroupLoads> loads = clients[0]->group_table()->Loads();
  ASSERT_TRUE(loads.ok()) << loads.status();
  ASSERT_EQ(loads->size(), members_.size());
  std::set<int64_t> weights;
  for (const auto& [instance, load] : *loads) weights.insert(load.weight);
  EXPECT_EQ(weights.size(), 1u) << "unequal loads";
}

TEST_F(ClusterGroupsTest, OneClientForEveryRankKeepsEachRanksSequencesOnOneServer) {
  client::ClusterOptions options = GroupOptions();
  options.placement_group_of = [](absl::string_view id) {
    return std::string(id.substr(0, id.rfind('/')));  // "run/rN"
  };
  std::unique_ptr<client::ClusterClient> cluster = Connect(options);
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->RegisterPrefix("system", "", Prompt()).ok());
  // Interleaved, as ranks that start together: s0 of every rank, then s1, ...
  for (int s = 0; s < kPerRank; ++s) {
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(cluster->CreateSequence(absl::StrCat("run/r", r, "/s", s), "system").ok());
    }
  }
  const std::map<std::string, int> ranks_per_server =
      RanksPerServer(std::vector<client::ClusterClient*>(kRanks, cluster.get()));
  ASSERT_EQ(ranks_per_server.size(), members_.size());
  for (const auto& [server, count] : ranks_per_server) EXPECT_EQ(count, 2) << server;
  // A rank's call then goes to one server, which decodes all of it in one batch.
  const engine::ModelConfig model = TinyModel();
  const int width = model.dk_latent();
  v1::DecodeRequest request;
  for (int s = 0; s < kPerRank; ++s) {
    const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng_);
    *request.add_queries() =
        client::LatentQuery(absl::StrCat("run/r3/s", s), 0, 1, Tensor3(q, 1, model.heads, width));
  }
  absl::StatusOr<v1::DecodeResponse> answer = cluster->DecodeRaw(request);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->results_size(), kPerRank);
}

TEST_F(ClusterGroupsTest, AGroupsClaimFollowsItsSequencesAndGoesWithTheLast) {
  std::unique_ptr<client::ClusterClient> cluster = Connect(GroupOptions());
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<client::ClusterClient> observer = Connect(GroupOptions());
  ASSERT_NE(observer, nullptr);
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(
        cluster->CreateSequence(absl::StrCat("g/s", s), "", v1::KV_DTYPE_UNSPECIFIED, "batch-0")
            .ok());
  }
  absl::StatusOr<std::pair<std::string, std::string>> group = cluster->GroupOf("g/s0");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(cluster->GroupOf("g/s2")->first, group->first);
  // Without a prefix a group weighs its sequences: 3, as the other client reads it.
  absl::StatusOr<cluster::GroupLoads> loads = observer->group_table()->Loads();
  ASSERT_TRUE(loads.ok());
  EXPECT_EQ((*loads)[group->second].weight, 3);
  ASSERT_TRUE(cluster->ReleaseSequence("g/s0").ok());
  EXPECT_EQ((*observer->group_table()->Loads())[group->second].weight, 2);
  ASSERT_TRUE(cluster->ReleaseSequence("g/s1").ok());
  ASSERT_TRUE(cluster->ReleaseSequence("g/s2").ok());
  EXPECT_TRUE(observer->group_table()->Loads()->empty());
  // A sequence in no group (no prefix, no group) is placed alone.
  ASSERT_TRUE(cluster->CreateSequence("alone").ok());
  EXPECT_TRUE(absl::IsNotFound(cluster->GroupOf("alone").status()));
}

TEST_F(ClusterGroupsTest, AServerThatJoinsTakesItsShareUnderLoadAndNoCallFails) {
  client::ClusterOptions options = GroupOptions();
  options.placement_group_of = [](absl::string_view id) {
    return std::string(id.substr(0, id.rfind('/')));
  };
  std::unique_ptr<client::ClusterClient> cluster = Connect(options);
  ASSERT_NE(cluster, nullptr);
  // The third server leaves the cluster (it keeps serving, unregistered) ...
  const std::string late = members_[2].server->target();
  members_[2].membership.reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (cluster->membership().Members().size() != 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(cluster->membership().Members().size(), 2u);
  // ... while six groups of four (no prefix: weight 4 each) go to the other two.
  const engine::ModelConfig model = TinyModel();
  const int width = model.dk_latent();
  for (int s = 0; s < kPerRank; ++s) {
    for (int r = 0; r < kRanks; ++r) {
      const std::string id = absl::StrCat("run/r", r, "/s", s);
      ASSERT_TRUE(cluster->CreateSequence(id).ok());
      const std::vector<Bf16> rows = RandomBf16(static_cast<size_t>(8) * width, 1.0, rng_);
      ASSERT_TRUE(cluster->AppendKv(id, 0, 0, Tensor2(rows, 8, width)).ok());
    }
  }
  std::map<std::string, int> before =
      RanksPerServer(std::vector<client::ClusterClient*>(kRanks, cluster.get()));
  ASSERT_EQ(before.size(), 2u);
  EXPECT_EQ(before.count(late), 0u);
  absl::StatusOr<client::RebalanceReport> nothing = cluster->Rebalance();
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ(nothing->groups_moved, 0) << "3 and 3 on two servers is balanced";

  // Every rank decodes all the while.
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::vector<absl::Status> failures;
  std::mutex failures_mu;
  std::thread load([&] {
    Rng rng(std::random_device{}());
    while (!stop.load()) {
      for (int r = 0; r < kRanks && !stop.load(); ++r) {
        v1::DecodeRequest request;
        for (int s = 0; s < kPerRank; ++s) {
          const std::vector<Bf16> q =
              RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng);
          *request.add_queries() = client::LatentQuery(absl::StrCat("run/r", r, "/s", s), 0, 1,
                                                       Tensor3(q, 1, model.heads, width));
        }
        absl::StatusOr<v1::DecodeResponse> answer = cluster->DecodeRaw(request);
        ++calls;
        if (!answer.ok()) {
          std::lock_guard<std::mutex> lock(failures_mu);
          failures.push_back(answer.status());
        }
      }
    }
  });
  // The third server joins again; rebalancing gives it two groups.
  absl::StatusOr<std::unique_ptr<cluster::ClusterMembership>> joined =
      cluster::ClusterMembership::Start(
          etcd_.Client(),
          [] {
            cluster::MembershipOptions o;
            o.cluster = kCluster;
            o.lease_ttl = absl::Seconds(3);
            o.refresh_interval = absl::Milliseconds(500);
            return o;
          }(),
          cluster::DescribeServer(members_[2].server->server(), late, "test"));
  ASSERT_TRUE(joined.ok()) << joined.status();
  members_[2].membership = *std::move(joined);
  const absl::Time seen = absl::Now() + absl::Seconds(10);
  while (cluster->membership().Members().size() != 3 && absl::Now() < seen) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  absl::StatusOr<client::RebalanceReport> moved = cluster->Rebalance();
  absl::SleepFor(absl::Milliseconds(200));  // calls after the moves too
  stop = true;
  load.join();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->groups_moved, 2);
  EXPECT_EQ(moved->sequences_moved, 2 * kPerRank);
  RecordProperty("rebalance_ms", static_cast<int>(moved->seconds * 1000));
  RecordProperty("calls_during", calls.load());
  EXPECT_GT(calls.load(), 0);
  for (const absl::Status& failure : failures) ADD_FAILURE() << "a call failed: " << failure;
  const std::map<std::string, int> after =
      RanksPerServer(std::vector<client::ClusterClient*>(kRanks, cluster.get()));
  ASSERT_EQ(after.size(), 3u);
  for (const auto& [server, count] : after) EXPECT_EQ(count, 2) << server;
  for (int s = 0; s < kPerRank; ++s) {
    for (int r = 0; r < kRanks; ++r) {
      const std::string id = absl::StrCat("run/r", r, "/s", s);
      EXPECT_TRUE(Holds(cluster->ServersOf(id)->front(), id)) << id;
    }
  }
  // Balanced now: a second pass moves nothing.
  absl::StatusOr<client::RebalanceReport> again = cluster->Rebalance();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->groups_moved, 0);
}

}  // namespace
}  // namespace mlaserve::integration
