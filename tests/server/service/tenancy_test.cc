// The tokens file, its errors naming the entry and field, and the translation of a tenant's
// ids into its namespace and back.

#include "server/service/tenancy.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/kv/client_id.h"
#include "server/service/tenant_scope.h"

namespace mlaserve::service {
namespace {

using ::testing::HasSubstr;

// sha256("test"), as FIPS 180-2 test tools print it.
constexpr char kTestHash[] = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

absl::StatusOr<std::unique_ptr<Tenancy>> Load(const std::string& entries) {
  return Tenancy::FromTokensFile(absl::StrCat(R"({"tenants": [)", entries, "]}"), "t.json", {10});
}

TEST(TenancyTest, TokenHashIsSha256InLowerCaseHex) {
  EXPECT_EQ(TokenHash("test"), kTestHash);
  EXPECT_EQ(TokenHash(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(TenancyTest, ReadsTenantsWithTheirQuotasSharesAndRights) {
  auto tenancy = Load(absl::StrCat(
      R"({"name": "a", "token_sha256": ")", kTestHash,
      R"(", "kv_quota_bytes": 1000, "max_queued_queries": 7, "rights": ["read", "decode"]},)",
      R"({"name": "b.team_2", "certificate_cn": "b.example"})"));
  ASSERT_TRUE(tenancy.ok()) << tenancy.status();
  EXPECT_EQ((*tenancy)->mode(), Tenancy::Mode::kTokens);
  const std::vector<const Tenant*> known = (*tenancy)->Known();
  ASSERT_EQ(known.size(), 2u);
  EXPECT_EQ(known[0]->name, "a");
  EXPECT_EQ(known[0]->max_queued_queries, 7);
  EXPECT_EQ(known[0]->rights, kRead | kDecode);
  EXPECT_EQ(known[1]->max_queued_queries, 10);  // the default share
  EXPECT_EQ(known[1]->rights, kAllRights);
  EXPECT_EQ((*tenancy)->KvQuotas(), (std::map<std::string, int64_t>{{"a", 1000}}));
}

TEST(TenancyTest, MalformedFilesNameTheEntryAndField) {
  const std::string hash = absl::StrCat(R"(", "token_sha256": ")", kTestHash, R"(")");
  struct Case {
    std::string json;
    const char* message;
  } cases[] = {
      {"not json", "is not JSON"},
      {R"({"tenants": []})", "non-empty \"tenants\""},
      {R"({"tenants": [{"name": "a"}]})", "tenants[0] needs token_sha256 or certificate_cn"},
      {R"({"tenants": [{"name": "a b", "certificate_cn": "x"}]})", "tenants[0].name"},
      {absl::StrCat(R"({"tenants": [{"name": "a)", hash,
                    "}, {\"name\": \"a\", \"certificate_cn\": \"y\"}]}"),
       "tenants[1].name is used twice"},
      {R"({"tenants": [{"name": "a", "token_sha256": "ABC"}]})", "tenants[0].token_sha256"},
      {absl::StrCat(R"({"tenants": [{"name": "a)", hash, "}, {\"name\": \"b", hash, "}]}"),
       "tenants[1].token_sha256 is another tenant's"},
      {absl::StrCat(R"({"tenants": [{"name": "a)", hash, R"(, "kv_quota_bytes": -1}]})"),
       "tenants[0].kv_quota_bytes"},
      {absl::StrCat(R"({"tenants": [{"name": "a)", hash, R"(, "max_queued_queries": 0}]})"),
       "tenants[0].max_queued_queries"},
      {absl::StrCat(R"({"tenants": [{"name": "a)", hash, R"(, "rights": ["admin"]}]})"),
       "tenants[0].rights"},
      {absl::StrCat(R"({"tenants": [{"name": "a)", hash, R"(, "token": "plain"}]})"),
       "tenants[0] has an unknown field \"token\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    auto tenancy = Tenancy::FromTokensFile(c.json, "t.json", {10});
    ASSERT_FALSE(tenancy.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(tenancy.status()));
    EXPECT_THAT(std::string(tenancy.status().message()), HasSubstr("--auth_tokens_file t.json"));
    EXPECT_THAT(std::string(tenancy.status().message()), HasSubstr(c.message));
  }
}

TEST(TenancyTest, QueueShareHoldsUnderConcurrency) {
  Tenant tenant;
  tenant.max_queued_queries = 10;
  std::atomic<int64_t> peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        if (!tenant.TryQueue(3)) continue;
        const int64_t now = tenant.queued_queries.load();
        int64_t seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
        tenant.Unqueue(3);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(peak.load(), 10);
  EXPECT_EQ(tenant.queued_queries.load(), 0);
}

TEST(TenantScopeTest, IdsMoveIntoTheNamespaceAndBackOut) {
  Tenant tenant;
  tenant.name = "alpha";
  v1::CreateSequenceRequest create;
  create.set_sequence_id("s");
  create.set_prefix_id("p");
  ASSERT_TRUE(ScopeIds(&tenant, create).ok());
  EXPECT_EQ(create.sequence_id(),
            "\xff"
            "alpha"
            "\xff"
            "s");
  EXPECT_EQ(engine::IdNamespace(create.prefix_id()), "alpha");
  EXPECT_EQ(engine::ClientPart(create.prefix_id()), "p");
  // An optional id left empty stays empty: "no prefix", not a prefix named "".
  v1::CreateSequenceRequest bare;
  bare.set_sequence_id("b");
  ASSERT_TRUE(ScopeIds(&tenant, bare).ok());
  EXPECT_TRUE(bare.prefix_id().empty());
  // The id's own limits hold before the namespace is added.
  v1::ReleaseSequenceRequest empty;
  const absl::Status refused = ScopeIds(&tenant, empty);
  EXPECT_TRUE(absl::IsInvalidArgument(refused));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("sequence_id is empty"));
  v1::GetSequenceRequest long_id;
  long_id.set_sequence_id(std::string(engine::kMaxClientIdBytes + 1, 'x'));
  EXPECT_TRUE(absl::IsInvalidArgument(ScopeIds(&tenant, long_id)));
  long_id.set_sequence_id(std::string(engine::kMaxClientIdBytes, 'x'));
  ASSERT_TRUE(ScopeIds(&tenant, long_id).ok());
  EXPECT_TRUE(engine::CheckClientId("sequence_id", long_id.sequence_id()).ok());
  // Answers and messages come back without the namespace.
  v1::Sequence sequence;
  sequence.set_sequence_id(create.sequence_id());
  sequence.set_prefix_id(create.prefix_id());
  UnscopeIds(&tenant, sequence);
  EXPECT_EQ(sequence.sequence_id(), "s");
  EXPECT_EQ(sequence.prefix_id(), "p");
  EXPECT_EQ(engine::QuoteId(create.sequence_id()), "'s'");
  const absl::Status message =
      UnscopeStatus(&tenant, absl::NotFoundError(absl::StrCat("x ", create.sequence_id())));
  EXPECT_EQ(message.message(), "x s");
  // Without a tenant nothing changes.
  v1::ForkSequenceRequest fork;
  fork.set_source_sequence_id("a");
  fork.set_new_sequence_id("b");
  ASSERT_TRUE(ScopeIds(nullptr, fork).ok());
  EXPECT_EQ(fork.source_sequence_id(), "a");
}

TEST(TenantScopeTest, RightsAreCheckedByName) {
  Tenant reader;
  reader.name = "r";
  reader.rights = kRead;
  EXPECT_TRUE(CheckRight(&reader, kRead, "GetSequence").ok());
  const absl::Status denied = CheckRight(&reader, kWrite, "AppendKv");
  EXPECT_TRUE(absl::IsPermissionDenied(denied));
  EXPECT_EQ(denied.message(), "AppendKv: tenant 'r' has no write right");
  EXPECT_EQ(reader.permission_denials.load(), 1);
  ParsedDecode decode;
  decode.queries.emplace_back().sequence_id = "s";
  const std::vector<Bf16> row(576);
  decode.queries[0].append_rows =
      *TensorView<const Bf16, 2>::Create(std::span<const Bf16>(row), {1, 576});
  EXPECT_TRUE(absl::IsPermissionDenied(ScopeIds(&reader, decode)));
  EXPECT_EQ(decode.queries[0].sequence_id, "s");  // refused: nothing namespaced
  EXPECT_TRUE(CheckRight(nullptr, kWrite, "AppendKv").ok());
}

}  // namespace
}  // namespace mlaserve::service
