// The cluster tests' fixture: a real etcd (Debian's, on loopback) and three real servers in
// this process, each registered as the server binary registers itself; cluster clients
// connected to them.
#ifndef MLASERVE_TESTS_INTEGRATION_CLUSTER_CLIENT_FIXTURE_H_
#define MLASERVE_TESTS_INTEGRATION_CLUSTER_CLIENT_FIXTURE_H_

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cluster/cluster_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cluster/cluster_membership.h"
#include "server/cluster/member_description.h"
#include "server/engine/model/model_weights.h"
#include "tests/integration/integration_server.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/scratch_dir.h"

namespace mlaserve::integration {

constexpr char kCluster[] = "cluster-client-test";

// A server and its membership, as mlaserve-server runs them with --etcd_endpoints.
struct Member {
  std::unique_ptr<IntegrationServer> server;
  std::unique_ptr<cluster::ClusterMembership> membership;
};

class ClusterClientTest : public ::testing::Test {
 protected:
  // The device each server runs: its default (an emulated NPU), or a GPU.
  virtual std::string gpu() const { return ""; }

  void SetUp() override {
    for (int i = 0; i < 3; ++i) {
      Member member;
      engine::EngineOptions engine_options = SmallEngineOptions(TinyModel());
      engine_options.gpu = gpu();
      member.server = std::make_unique<IntegrationServer>(engine_options);
      cluster::MembershipOptions options;
      options.cluster = kCluster;
      options.lease_ttl = absl::Seconds(3);
      options.refresh_interval = absl::Milliseconds(500);
      absl::StatusOr<std::unique_ptr<cluster::ClusterMembership>> joined =
          cluster::ClusterMembership::Start(
              etcd_.Client(), options,
              cluster::DescribeServer(member.server->server(), member.server->target(), "test"));
      ASSERT_TRUE(joined.ok()) << joined.status();
      member.membership = *std::move(joined);
      members_.push_back(std::move(member));
    }
  }

  // The options the tests connect with: spread at 2 sequences, 256 tokens expected.
  client::ClusterOptions Options(int64_t context_part_tokens = 0) const {
    client::ClusterOptions options;
    options.etcd_endpoints = {etcd_.endpoint()};
    options.cluster = kCluster;
    options.expected_sequence_tokens = 256;
    options.spread_group = 2;
    options.context_part_tokens = context_part_tokens;
    return options;
  }

  std::unique_ptr<client::ClusterClient> Connect(int64_t context_part_tokens = 0) {
    return Connect(Options(context_part_tokens));
  }

  std::unique_ptr<client::ClusterClient> Connect(client::ClusterOptions options) {
    absl::StatusOr<std::unique_ptr<client::ClusterClient>> client =
        client::ClusterClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    // Every member seen before the test places anything.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while ((*client)->membership().Members().size() < members_.size() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ((*client)->membership().Members().size(), members_.size());
    return *std::move(client);
  }

  // The member serving `address`.
  Member& At(const std::string& address) {
    for (Member& member : members_) {
      if (member.server->target() == address) return member;
    }
    ADD_FAILURE() << "no member at " << address;
    return members_.front();
  }

  // Whether `address` holds sequence `id`, as its own admin listing says.
  bool Holds(const std::string& address, const std::string& id) {
    absl::StatusOr<v1::ListSequencesResponse> listed =
        At(address).server->client().ListSequences(100);
    if (!listed.ok()) return false;
    for (const v1::SequenceSummary& sequence : listed->sequences()) {
      if (sequence.sequence().sequence_id() == id) return true;
    }
    return false;
  }

  void MoveUnderLoad() {
    std::unique_ptr<client::ClusterClient> cluster = Connect();
    ASSERT_NE(cluster, nullptr);
    const engine::ModelConfig model = TinyModel();
    const int width = model.dk_latent();
    ASSERT_TRUE(cluster->CreateSequence("busy").ok());
    std::vector<Bf16> rows = RandomBf16(16 * static_cast<size_t>(width), 1.0, rng_);
    ASSERT_TRUE(cluster->AppendKv("busy", 0, 0, Tensor2(rows, 16, width)).ok());
    const std::string source = cluster->ServersOf("busy")->front();
    std::atomic<int> steps{0};
    std::atomic<bool> stop{false};
    std::thread load([&] {
      Rng rng(std::random_device{}());
      while (!stop.load() && steps.load() < 400) {
        const std::vector<Bf16> row = RandomBf16(static_cast<size_t>(width), 1.0, rng);
        const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng);
        v1::DecodeQuery query =
            client::LatentQuery("busy", 0, 1, Tensor3(q, 1, model.heads, width));
        client::AppendBeforeDecode(query, Tensor2(row, 1, width),
                                   static_cast<int64_t>(rows.size() / width));
        absl::StatusOr<std::vector<client::DecodeOutput>> answer = cluster->Decode({query});
        ASSERT_TRUE(answer.ok()) << "step " << steps.load() << ": " << answer.status();
        rows.insert(rows.end(), row.begin(), row.end());
        const GoldenOutput golden = GoldenLatent(model, rows, q, 1);
        ASSERT_TRUE(testing::AllClose((*answer)[0].out, golden.out, kLatentOutTolerance, true))
            << "step " << steps.load();
        ++steps;
      }
    });
    while (steps.load() < 20) absl::SleepFor(absl::Milliseconds(5));
    std::string destination;
    for (const Member& m : members_) {
      if (m.server->target() != source) destination = m.server->target();
    }
    v1::MigrateSequencesRequest move;
    move.set_target(destination);  // every sequence: just this one
    absl::StatusOr<v1::MigrateSequencesResponse> moved =
        At(source).server->client().MigrateSequences(move, absl::Seconds(60));
    const int at_move = steps.load();
    while (steps.load() < at_move + 20 && !HasFatalFailure()) absl::SleepFor(absl::Milliseconds(5));
    stop = true;
    load.join();
    ASSERT_TRUE(moved.ok()) << moved.status();
    EXPECT_EQ(moved->sequences(), 1);
    EXPECT_THAT(*cluster->ServersOf("busy"), ::testing::ElementsAre(destination));
    absl::StatusOr<v1::Sequence> there = At(destination).server->client().GetSequence("busy");
    ASSERT_TRUE(there.ok()) << there.status();
    EXPECT_EQ(there->layer_lengths(0), static_cast<int64_t>(rows.size() / width));
    std::cout << "moved under load after " << at_move << " steps, held "
              << moved->held_seconds() * 1000 << " ms; " << steps.load() << " steps in all\n";
  }

  testing::EtcdProcess etcd_{MLASERVE_ETCD_BINARY};
  std::vector<Member> members_;
  Rng rng_{std::random_device{}()};
};

inline std::vector<Bf16> LayerRows(const std::vector<Bf16>& latent, int layer, int tokens,
                                   int width) {
  return {latent.begin() + static_cast<ptrdiff_t>(layer) * tokens * width,
          latent.begin() + static_cast<ptrdiff_t>(layer + 1) * tokens * width};
}

}  // namespace mlaserve::integration

#endif  // MLASERVE_TESTS_INTEGRATION_CLUSTER_CLIENT_FIXTURE_H_
