#include "client/loadgen/multi_target.h"

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/client/loadgen/fake_load_target.h"

namespace mlaserve::loadgen {
namespace {

struct Cluster {
  std::vector<FakeTarget*> servers;
  std::unique_ptr<MultiTarget> target;
};

Cluster MakeCluster(int n, MultiTarget::Spread spread = MultiTarget::Spread::kPrefixHash) {
  Cluster c;
  std::vector<std::unique_ptr<LoadTarget>> targets;
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) {
    auto server = std::make_unique<FakeTarget>(std::chrono::microseconds(0), /*mark=*/i);
    server->model_.max_batch = 64;  // a whole decode of the tests below fits one server
    c.servers.push_back(server.get());
    targets.push_back(std::move(server));
    names.push_back(absl::StrCat("server-", i));
  }
  absl::StatusOr<std::unique_ptr<MultiTarget>> multi =
      MultiTarget::Create(std::move(targets), names, spread);
  EXPECT_TRUE(multi.ok()) << multi.status();
  c.target = *std::move(multi);
  return c;
}

LoadQuery Query(const std::string& id, int64_t position) {
  LoadQuery q;
  q.sequence_id = id;
  q.append_position = position;
  return q;
}

// Plain hashing, the baseline of the cluster's placement: the prompt everywhere, each
// sequence where its own id hashes.
TEST(MultiTargetTest, SequenceHashingPutsThePromptEverywhereAndSpreadsItsSequences) {
  Cluster c = MakeCluster(3, MultiTarget::Spread::kSequenceHash);
  const std::vector<Bf16> prompt(static_cast<size_t>(FakeTarget::kLayers) * 4 * 8);
  ASSERT_TRUE(c.target->RegisterPrefix("prompt", prompt, 4, std::nullopt).ok());
  for (FakeTarget* server : c.servers) EXPECT_EQ(server->prefixes_.count("prompt"), 1u);
  std::vector<int> per_server(3);
  for (int i = 0; i < 90; ++i) {
    const std::string id = absl::StrCat("on-prompt-", i);
    ASSERT_TRUE(c.target->CreateSequence(id, "prompt", std::nullopt).ok());
    EXPECT_EQ(c.target->TargetOf(id), MultiTarget::HashTarget(id, 3));
    ++per_server[c.target->TargetOf(id)];
  }
  for (int count : per_server) EXPECT_GT(count, 10);
  ASSERT_TRUE(c.target->ReleasePrefix("prompt").ok());
  for (FakeTarget* server : c.servers) EXPECT_EQ(server->prefixes_.count("prompt"), 0u);
}

TEST(MultiTargetTest, APromptsSequencesStayWithItAndOthersSpreadByTheirId) {
  Cluster c = MakeCluster(3);
  const std::vector<Bf16> prompt(static_cast<size_t>(FakeTarget::kLayers) * 4 * 8);
  ASSERT_TRUE(c.target->RegisterPrefix("prompt", prompt, 4, std::nullopt).ok());
  const int home = MultiTarget::HashTarget("prompt", 3);
  EXPECT_EQ(c.servers[home]->prefixes_.count("prompt"), 1u);
  for (int i = 0; i < 30; ++i) {
    const std::string id = absl::StrCat("on-prompt-", i);
    ASSERT_TRUE(c.target->CreateSequence(id, "prompt", std::nullopt).ok());
    EXPECT_EQ(c.target->TargetOf(id), home);
  }
  EXPECT_EQ(c.servers[home]->sequences_.size(), 30u);
  std::vector<int> per_server(3);
  for (int i = 0; i < 300; ++i) {
    const std::string id = absl::StrCat("alone-", i);
    ASSERT_TRUE(c.target->CreateSequence(id, "", std::nullopt).ok());
    ++per_server[c.target->TargetOf(id)];
  }
  // A hash of the id spreads them: each server's share is Binomial(300, 1/3), sd 8.
  for (int n : per_server) EXPECT_NEAR(n, 100, 40);
  // Stable: the same id always picks the same server.
  EXPECT_EQ(MultiTarget::HashTarget("alone-7", 3), MultiTarget::HashTarget("alone-7", 3));
}

TEST(MultiTargetTest, ADecodeIsSplitPerServerAndItsAnswersComeBackInOrder) {
  Cluster c = MakeCluster(3);
  std::vector<LoadQuery> queries;
  for (int i = 0; i < 24; ++i) {
    const std::string id = absl::StrCat("s", i);
    ASSERT_TRUE(c.target->CreateSequence(id, "", std::nullopt).ok());
    queries.push_back(Query(id, 0));
  }
  absl::StatusOr<std::vector<LoadAnswer>> answers = c.target->Decode(queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ASSERT_EQ(answers->size(), queries.size());
  for (size_t i = 0; i < queries.size(); ++i) {
    // The fake marks its answers with its index: each answer came from the query's server.
    EXPECT_EQ((*answers)[i].group_size, c.target->TargetOf(queries[i].sequence_id)) << i;
  }
  size_t decoded = 0;
  for (FakeTarget* s : c.servers) {
    EXPECT_TRUE(s->breaches_.empty()) << s->breaches_.front();
    for (int size : s->batch_sizes_) decoded += static_cast<size_t>(size);
    EXPECT_EQ(s->batch_sizes_.size(), 1u) << "one call per server";
  }
  EXPECT_EQ(decoded, queries.size());

  c.servers[1]->decode_error = absl::StatusCode::kUnavailable;
  absl::StatusOr<std::vector<LoadAnswer>> failed = c.target->Decode(queries);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
}

TEST(MultiTargetTest, ReleasedSequencesAreForgottenAndOtherModelsRefused) {
  Cluster c = MakeCluster(2);
  ASSERT_TRUE(c.target->CreateSequence("x", "", std::nullopt).ok());
  ASSERT_TRUE(c.target->ReleaseSequence("x").ok());
  for (FakeTarget* s : c.servers) EXPECT_TRUE(s->sequences_.empty());

  std::vector<std::unique_ptr<LoadTarget>> targets;
  targets.push_back(std::make_unique<FakeTarget>(std::chrono::microseconds(0)));
  auto other = std::make_unique<FakeTarget>(std::chrono::microseconds(0));
  other->model_.heads = 16;
  targets.push_back(std::move(other));
  absl::StatusOr<std::unique_ptr<MultiTarget>> mixed =
      MultiTarget::Create(std::move(targets), {"a:1", "b:2"});
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mixed.status().message().find("b:2"), std::string::npos);
}

}  // namespace
}  // namespace mlaserve::loadgen
