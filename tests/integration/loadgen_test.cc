// The load generator against the real server: a short workload runs, creates what it needs in
// the format asked for, and releases everything.

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/loadgen/continuous.h"
#include "client/loadgen/continuous_report.h"
#include "client/loadgen/grpc_load_target.h"
#include "client/loadgen/multi_target.h"
#include "client/loadgen/workload.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

TEST(LoadgenTest, AShortRunInTheFormatAskedForLeavesNothingBehind) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  for (const KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
    auto target = loadgen::GrpcLoadTarget::Create(server.NewClient());
    ASSERT_TRUE(target.ok()) << target.status();
    loadgen::WorkloadOptions o;
    o.workers = 2;
    o.sequences = 3;
    o.prefix_tokens = 40;
    o.context_tokens = 9;
    o.duration = absl::Milliseconds(300);
    o.kv_dtype = dtype;
    o.run_id = KvDtypeName(dtype);
    absl::StatusOr<loadgen::LoadResult> result = loadgen::RunWorkload(**target, o);
    ASSERT_TRUE(result.ok()) << result.status();
    int answers = 0;
    for (const loadgen::CallRecord& call : result->calls) {
      EXPECT_EQ(call.code, absl::StatusCode::kOk);
      for (const loadgen::LoadAnswer& a : call.answers) {
        EXPECT_EQ(a.fp8, dtype == KvDtype::kFp8);
        ++answers;
      }
    }
    EXPECT_GT(answers, 0);
    // Everything the run made is gone: the sequences' ids are free again.
    EXPECT_EQ(
        server.client().GetSequence(std::string(KvDtypeName(dtype)) + "/w0/s0").status().code(),
        absl::StatusCode::kNotFound);
  }
}

TEST(LoadgenTest, ContinuousTrafficRunsOnTheServerAndLeavesNothingBehind) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  auto target = loadgen::GrpcLoadTarget::Create(server.NewClient());
  ASSERT_TRUE(target.ok()) << target.status();
  loadgen::ContinuousOptions o;
  o.ranks = 2;
  o.sequences = 4;
  o.arrivals = *loadgen::ArrivalProcess::Create(60, 0.5);
  o.context = *loadgen::LengthDistribution::Parse("uniform:1,20", "context-dist", 64);
  o.steps = *loadgen::LengthDistribution::Parse("uniform:2,8", "steps-dist", 64);
  o.prompts = *loadgen::PromptMix::Parse("40:2,24:1");
  o.warmup = absl::Milliseconds(200);
  o.duration = absl::Milliseconds(800);
  o.head_space = false;
  o.run_id = "continuous";
  absl::StatusOr<loadgen::ContinuousResult> result = loadgen::RunContinuous(**target, o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->admission_errors.empty());
  for (const loadgen::CallRecord& call : result->calls) EXPECT_EQ(call.code, absl::StatusCode::kOk);
  const loadgen::PointSummary point = loadgen::SummarizePoint(*result, std::nullopt, 1000.0);
  EXPECT_GT(point.finished, 0);
  EXPECT_GT(point.tokens, 0);
  EXPECT_EQ(point.failed_calls, 0);
  // Every sequence and both system prompts are gone.
  absl::StatusOr<v1::ListSequencesResponse> sequences = server.client().ListSequences(1000, "", "");
  ASSERT_TRUE(sequences.ok()) << sequences.status();
  EXPECT_EQ(sequences->sequences_size(), 0);
  absl::StatusOr<v1::ListPrefixesResponse> prefixes = server.client().ListPrefixes(1000, "");
  ASSERT_TRUE(prefixes.ok()) << prefixes.status();
  EXPECT_EQ(prefixes->prefixes_size(), 0);
}

TEST(LoadgenTest, SeveralServersShareTheSequencesAndAnswerOneDecodeTogether) {
  IntegrationServer first(SmallEngineOptions(TinyModel()));
  IntegrationServer second(SmallEngineOptions(TinyModel()));
  std::vector<std::unique_ptr<loadgen::LoadTarget>> targets;
  for (IntegrationServer* server : {&first, &second}) {
    auto target = loadgen::GrpcLoadTarget::Create(server->NewClient());
    ASSERT_TRUE(target.ok()) << target.status();
    targets.push_back(*std::move(target));
  }
  auto multi = loadgen::MultiTarget::Create(std::move(targets), {"first", "second"});
  ASSERT_TRUE(multi.ok()) << multi.status();
  loadgen::WorkloadOptions o;
  o.workers = 1;
  o.sequences = 12;
  o.prefix_tokens = 0;  // no prompt: every sequence goes where the hash of its id points
  o.context_tokens = 5;
  o.duration = absl::Milliseconds(300);
  o.run_id = "multi";
  absl::StatusOr<loadgen::LoadResult> result = loadgen::RunWorkload(**multi, o);
  ASSERT_TRUE(result.ok()) << result.status();
  int answers = 0;
  for (const loadgen::CallRecord& call : result->calls) {
    EXPECT_EQ(call.code, absl::StatusCode::kOk);
    answers += static_cast<int>(call.answers.size());
  }
  EXPECT_GT(answers, 0);
  int on_first = 0;
  for (int s = 0; s < 12; ++s) on_first += (*multi)->TargetOf(absl::StrCat("multi/w0/s", s)) == 0;
  EXPECT_GT(on_first, 0);
  EXPECT_LT(on_first, 12);
  for (IntegrationServer* server : {&first, &second}) {
    absl::StatusOr<v1::ListSequencesResponse> left = server->client().ListSequences(1000);
    ASSERT_TRUE(left.ok()) << left.status();
    EXPECT_EQ(left->sequences_size(), 0);
  }
}

}  // namespace
}  // namespace mlaserve::integration
