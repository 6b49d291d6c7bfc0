// Tenants on the real server: bearer tokens from a tokens file, each tenant's own namespace
// of ids (whatever ids another tries, it cannot see, append to, fork, decode or release
// them), rights, KV quotas that hold under concurrency, and a share of the decode queue.

#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/health_check.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "server/service/tenancy.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAlphaToken[] = "alpha-secret-7f3a";
constexpr char kBetaToken[] = "beta-secret-91c2";
constexpr char kReaderToken[] = "reader-secret-0d44";
constexpr int64_t kAlphaQuota = int64_t{4} << 20;
constexpr int kBetaShare = 4;

std::shared_ptr<service::Tenancy> Tenants() {
  const std::string json = absl::StrCat(
      R"({"tenants": [)", R"({"name": "alpha", "token_sha256": ")", service::TokenHash(kAlphaToken),
      R"(", "kv_quota_bytes": )", kAlphaQuota, "},", R"({"name": "beta", "token_sha256": ")",
      service::TokenHash(kBetaToken), R"(", "max_queued_queries": )", kBetaShare, "},",
      R"({"name": "reader", "token_sha256": ")", service::TokenHash(kReaderToken),
      R"(", "rights": ["read"]}]})");
  auto tenancy = service::Tenancy::FromTokensFile(json, "test.json", {64});
  EXPECT_TRUE(tenancy.ok()) << tenancy.status();
  return std::move(*tenancy);
}

class TenantsTest : public ::testing::Test {
 protected:
  TenantsTest() {
    std::shared_ptr<service::Tenancy> tenancy = Tenants();
    engine::EngineOptions options = SmallEngineOptions(TinyModel());
    options.kv.namespace_budget_bytes = tenancy->KvQuotas();
    service::ServerOptions server_options;
    server_options.tenancy = tenancy;
    server_ = std::make_unique<IntegrationServer>(options, "", server_options);
    alpha_ = Client(kAlphaToken);
    beta_ = Client(kBetaToken);
  }

  std::unique_ptr<client::MlaServeClient> Client(const std::string& token, int attempts = 4) {
    client::ClientOptions options;
    options.bearer_token = token;
    options.max_attempts = attempts;
    return server_->NewClient(options);
  }

  // Fresh values; the concurrency tests call it from several threads, and a shared engine
  // raced on corrupts its state (UBSan caught an index past the twister's end).
  std::vector<Bf16> Random(size_t count) {
    std::lock_guard lock(rng_mu_);
    return RandomBf16(count, 1.0, rng_);
  }
  v1::Tensor Rows(int n) { return Tensor2(Random(static_cast<size_t>(n) * 576), n, 576); }
  v1::DecodeQuery Query(const std::string& id) {
    const engine::ModelConfig& m = server_->model();
    return client::LatentQuery(
        id, 0, 1,
        Tensor3(Random(static_cast<size_t>(m.heads) * m.dk_latent()), 1, m.heads, m.dk_latent()));
  }

  // Alpha's state: prefix "p" (40 tokens), sequence "s" on it (+10), sequence "t" (30).
  void BuildAlpha() {
    const engine::ModelConfig& m = server_->model();
    ASSERT_TRUE(
        alpha_->RegisterPrefix("p", "", Tensor3(Random(size_t{2} * 40 * 576), m.layers, 40, 576))
            .ok());
    ASSERT_TRUE(alpha_->CreateSequence("s", "p").ok());
    ASSERT_TRUE(alpha_->CreateSequence("t").ok());
    for (int layer = 0; layer < m.layers; ++layer) {
      ASSERT_TRUE(alpha_->AppendKv("s", layer, 40, Rows(10)).ok());
      ASSERT_TRUE(alpha_->AppendKv("t", layer, 0, Rows(30)).ok());
    }
  }

  std::mutex rng_mu_;
  Rng rng_{std::random_device{}()};
  std::unique_ptr<IntegrationServer> server_;
  std::unique_ptr<client::MlaServeClient> alpha_;
  std::unique_ptr<client::MlaServeClient> beta_;
};

TEST_F(TenantsTest, CallsWithoutAKnownTokenAreUnauthenticatedAndHealthStillAnswers) {
  for (const std::string& token : {std::string(), std::string("not-a-tenant")}) {
    SCOPED_TRACE(token);
    auto stranger = Client(token);
    EXPECT_TRUE(absl::IsUnauthenticated(stranger->GetServerInfo().status()));
    EXPECT_TRUE(absl::IsUnauthenticated(stranger->CreateSequence("x").status()));
    EXPECT_TRUE(absl::IsUnauthenticated(stranger->AppendKv("x", 0, 0, Rows(1))));
    EXPECT_TRUE(absl::IsUnauthenticated(stranger->Decode({Query("x")}).status()));
    auto stream = stranger->OpenDecodeStream(absl::Seconds(10));
    v1::DecodeRequest request;
    *request.add_queries() = Query("x");
    stream->Send(1, request);
    stream->WritesDone();
    while (stream->Receive().has_value()) {
    }
    EXPECT_TRUE(absl::IsUnauthenticated(stream->Finish()));
  }
  EXPECT_EQ(server_->server().engine().Stats().kv.sequences, 0);
  // Probes need no token.
  auto channel = grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials());
  EXPECT_EQ(*client::CheckHealth(channel, ""), client::ServingStatus::kServing);
}

TEST_F(TenantsTest, ATenantReachesNothingOfAnothersWhateverIdsItTries) {
  BuildAlpha();
  v1::DecodeQuery probe = Query("s");
  const auto before = alpha_->DecodeRaw([&] {
    v1::DecodeRequest r;
    *r.add_queries() = probe;
    return r;
  }());
  ASSERT_TRUE(before.ok()) << before.status();
  // The plan names the prefix as alpha knows it.
  EXPECT_EQ(before->results(0).plan().prefix_id(), "p");

  for (const std::string id : {"s", "t"}) {
    SCOPED_TRACE(id);
    const absl::Status seen = beta_->GetSequence(id).status();
    EXPECT_TRUE(absl::IsNotFound(seen)) << seen;
    EXPECT_THAT(std::string(seen.message()), Not(HasSubstr("alpha")));
    EXPECT_THAT(std::string(seen.message()), Not(HasSubstr("\xff")));
    EXPECT_TRUE(absl::IsNotFound(beta_->AppendKv(id, 0, 40, Rows(1))));
    EXPECT_TRUE(absl::IsNotFound(beta_->ForkSequence(id, "mine").status()));
    EXPECT_TRUE(absl::IsNotFound(beta_->Decode({Query(id)}).status()));
    EXPECT_TRUE(beta_->ReleaseSequence(id).ok());  // an unknown id: nothing to release
  }
  EXPECT_TRUE(absl::IsNotFound(beta_->CreateSequence("mine", "p").status()));
  EXPECT_TRUE(beta_->ReleasePrefix("p").ok());
  // Ids that try to name alpha's namespace are not UTF-8, so they never parse.
  for (const std::string& id : {std::string("\xff"
                                            "alpha"
                                            "\xff"
                                            "s"),
                                std::string("\xff")}) {
    const absl::Status status = beta_->GetSequence(id).status();
    EXPECT_TRUE(absl::IsInvalidArgument(status) || absl::IsInternal(status)) << status;
    EXPECT_FALSE(beta_->ReleaseSequence(id).ok());
  }
  // Beta's own "s" is another sequence.
  ASSERT_TRUE(beta_->CreateSequence("s").ok());
  ASSERT_TRUE(beta_->AppendKv("s", 0, 0, Rows(3)).ok());
  const auto beta_s = beta_->GetSequence("s");
  ASSERT_TRUE(beta_s.ok());
  EXPECT_EQ(beta_s->sequence_id(), "s");
  EXPECT_EQ(beta_s->layer_lengths(0), 3);

  // Alpha's state is as it was: lengths, prefix, and the same answer bit for bit.
  const auto alpha_s = alpha_->GetSequence("s");
  ASSERT_TRUE(alpha_s.ok());
  EXPECT_EQ(alpha_s->sequence_id(), "s");
  EXPECT_EQ(alpha_s->prefix_id(), "p");
  EXPECT_EQ(alpha_s->layer_lengths(0), 50);
  const auto after = alpha_->DecodeRaw([&] {
    v1::DecodeRequest r;
    *r.add_queries() = probe;
    return r;
  }());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->results(0).out().data(), before->results(0).out().data());
  EXPECT_EQ(after->results(0).lse().data(), before->results(0).lse().data());
}

TEST_F(TenantsTest, RightsLimitWhatATenantMayCall) {
  BuildAlpha();
  auto reader = Client(kReaderToken);
  EXPECT_TRUE(reader->GetServerInfo().ok());
  EXPECT_TRUE(absl::IsNotFound(reader->GetSequence("s").status()));  // its own namespace
  const absl::Status create = reader->CreateSequence("r").status();
  EXPECT_TRUE(absl::IsPermissionDenied(create)) << create;
  EXPECT_THAT(std::string(create.message()), HasSubstr("write"));
  EXPECT_TRUE(absl::IsPermissionDenied(reader->AppendKv("r", 0, 0, Rows(1))));
  EXPECT_TRUE(absl::IsPermissionDenied(reader->Decode({Query("r")}).status()));
}

TEST_F(TenantsTest, KvQuotaHoldsUnderConcurrencyAndSparesOtherTenants) {
  // 8 threads of alpha append to sequences of their own until the quota refuses them.
  constexpr int kThreads = 8;
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto client = Client(kAlphaToken);
      Rng rng(t + 1);
      const std::string id = absl::StrCat("q", t);
      if (!client->CreateSequence(id).ok()) return;
      for (int64_t at = 0;; at += 64) {
        const v1::Tensor rows = Tensor2(RandomBf16(size_t{64} * 576, 1.0, rng), 64, 576);
        const absl::Status status = client->AppendKv(id, 0, at, rows);
        if (!status.ok()) {
          if (absl::IsResourceExhausted(status) && absl::StrContains(status.message(), "quota")) {
            refused.fetch_add(1);
          } else {
            ADD_FAILURE() << status;
          }
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(refused.load(), kThreads);
  const engine::KvStoreStats kv = server_->server().engine().Stats().kv;
  ASSERT_TRUE(kv.namespace_used_bytes.contains("alpha"));
  EXPECT_LE(kv.namespace_used_bytes.at("alpha"), kAlphaQuota);
  EXPECT_GT(kv.namespace_used_bytes.at("alpha"), kAlphaQuota - kThreads * kv.page_bytes);
  // Beta, with no quota of its own, still appends.
  ASSERT_TRUE(beta_->CreateSequence("b").ok());
  EXPECT_TRUE(beta_->AppendKv("b", 0, 0, Rows(256)).ok());
}

TEST_F(TenantsTest, AFloodFillsOnlyItsOwnShareOfTheQueue) {
  BuildAlpha();
  // One call's queries name distinct sequences (a sequence layer appears once per call).
  for (int q = 0; q < kBetaShare; ++q) {
    ASSERT_TRUE(beta_->CreateSequence(absl::StrCat("f", q)).ok());
    ASSERT_TRUE(beta_->AppendKv(absl::StrCat("f", q), 0, 0, Rows(64)).ok());
  }
  // Beta floods: many concurrent calls of kBetaShare queries each, no retries.
  std::atomic<int> unavailable{0}, answered{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> flood;
  for (int t = 0; t < 6; ++t) {
    flood.emplace_back([&] {
      auto client = Client(kBetaToken, /*attempts=*/1);
      while (!stop.load()) {
        std::vector<v1::DecodeQuery> queries;
        for (int q = 0; q < kBetaShare; ++q) queries.push_back(Query(absl::StrCat("f", q)));
        const absl::Status status = client->Decode(std::move(queries)).status();
        if (absl::IsUnavailable(status)) {
          EXPECT_THAT(std::string(status.message()), HasSubstr("share"));
          unavailable.fetch_add(1);
        } else if (status.ok()) {
          answered.fetch_add(1);
        } else {
          ADD_FAILURE() << status;
        }
      }
    });
  }
  // Meanwhile alpha gets every answer.
  int alpha_answers = 0;
  for (int i = 0; i < 20; ++i) {
    const auto out = alpha_->Decode({Query("s"), Query("t")});
    EXPECT_TRUE(out.ok()) << out.status();
    alpha_answers += out.ok();
  }
  stop = true;
  for (std::thread& t : flood) t.join();
  EXPECT_EQ(alpha_answers, 20);
  EXPECT_GT(unavailable.load(), 0);
  EXPECT_GT(answered.load(), 0);
}

TEST_F(TenantsTest, ListingsAndStatsShowATenantItsOwnStateOnly) {
  BuildAlpha();
  ASSERT_TRUE(beta_->CreateSequence("s").ok());
  ASSERT_TRUE(beta_->CreateSequence("u").ok());

  absl::StatusOr<v1::ListSequencesResponse> alpha_sequences = alpha_->ListSequences(1);
  ASSERT_TRUE(alpha_sequences.ok()) << alpha_sequences.status();
  ASSERT_EQ(alpha_sequences->sequences_size(), 1);
  EXPECT_EQ(alpha_sequences->sequences(0).sequence().sequence_id(), "s");
  EXPECT_EQ(alpha_sequences->sequences(0).sequence().prefix_id(), "p");
  ASSERT_EQ(alpha_sequences->next_page_token(), "s");
  alpha_sequences = alpha_->ListSequences(1, "s");
  ASSERT_TRUE(alpha_sequences.ok()) << alpha_sequences.status();
  ASSERT_EQ(alpha_sequences->sequences_size(), 1);
  EXPECT_EQ(alpha_sequences->sequences(0).sequence().sequence_id(), "t");
  EXPECT_EQ(alpha_sequences->next_page_token(), "");

  absl::StatusOr<v1::ListSequencesResponse> beta_sequences = beta_->ListSequences(0);
  ASSERT_TRUE(beta_sequences.ok()) << beta_sequences.status();
  ASSERT_EQ(beta_sequences->sequences_size(), 2);
  EXPECT_EQ(beta_sequences->sequences(0).sequence().sequence_id(), "s");
  EXPECT_EQ(beta_sequences->sequences(0).sequence().prefix_id(), "");
  EXPECT_EQ(beta_sequences->sequences(1).sequence().sequence_id(), "u");
  // Alpha's prefix is not beta's to list, nor to filter on.
  absl::StatusOr<v1::ListPrefixesResponse> beta_prefixes = beta_->ListPrefixes(0);
  ASSERT_TRUE(beta_prefixes.ok()) << beta_prefixes.status();
  EXPECT_EQ(beta_prefixes->prefixes_size(), 0);
  absl::StatusOr<v1::ListSequencesResponse> on_p = beta_->ListSequences(0, "", "p");
  ASSERT_TRUE(on_p.ok()) << on_p.status();
  EXPECT_EQ(on_p->sequences_size(), 0);
  on_p = alpha_->ListSequences(0, "", "p");
  ASSERT_TRUE(on_p.ok()) << on_p.status();
  ASSERT_EQ(on_p->sequences_size(), 1);
  EXPECT_EQ(on_p->sequences(0).sequence().sequence_id(), "s");

  absl::StatusOr<v1::GetStatsResponse> alpha_stats = alpha_->GetStats();
  ASSERT_TRUE(alpha_stats.ok()) << alpha_stats.status();
  EXPECT_EQ(alpha_stats->tenant(), "alpha");
  EXPECT_EQ(alpha_stats->tenant_kv_quota_bytes(), kAlphaQuota);
  EXPECT_EQ(alpha_stats->kv_bytes_budget(), kAlphaQuota);
  EXPECT_GT(alpha_stats->kv_bytes_used(), 0);
  EXPECT_EQ(alpha_stats->prefixes(), 1);
  EXPECT_EQ(alpha_stats->sequences(), 2);
  absl::StatusOr<v1::GetStatsResponse> beta_stats = beta_->GetStats();
  ASSERT_TRUE(beta_stats.ok()) << beta_stats.status();
  EXPECT_EQ(beta_stats->tenant(), "beta");
  EXPECT_EQ(beta_stats->kv_bytes_used(), 0);  // two empty sequences hold no page
  EXPECT_EQ(beta_stats->prefixes(), 0);
  EXPECT_EQ(beta_stats->sequences(), 2);

  // Read-only tenants may list (their own, empty, namespace).
  absl::StatusOr<v1::ListSequencesResponse> reader = Client(kReaderToken)->ListSequences(0);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->sequences_size(), 0);
  // Without a token: UNAUTHENTICATED, as every call.
  EXPECT_EQ(Client("", 1)->ListPrefixes(0).status().code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace mlaserve::integration
