// The engine's answers against the fp64 golden: mixed batches above and below TyphoonMLA's
// threshold, FP8 beside bf16, head shares, grouping flat and tree-aware, hybrid against absorb.
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/mla/fp8_accuracy.h"
#include "server/engine/engine_impl.h"
#include "tests/server/engine/engine_scenario.h"
#include "tests/server/engine/engine_test_devices.h"
#include "tests/testing/attention_checks.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::BaseOptions;
using ::mlaserve::engine::testing::DecodeSync;
using ::mlaserve::engine::testing::ExpectMatchesGolden;
using ::mlaserve::engine::testing::kOutTolerance;
using ::mlaserve::engine::testing::MakeEngine;
using ::mlaserve::engine::testing::OneEmulatedNpu;
using ::mlaserve::engine::testing::OwnedAnswer;
using ::mlaserve::engine::testing::Scenario;
using ::mlaserve::engine::testing::SetThreshold;
using ::testing::HasSubstr;

// Prefix chain P1 (300 tokens) <- P2 (+200); sequences on each with varied suffixes, and
// two with no prefix.
void BuildMixedScenario(Scenario& s) {
  s.RegisterPrefix("P1", "", 300);
  s.RegisterPrefix("P2", "P1", 200);
  s.CreateSequence("a1", "P1", 5);
  s.CreateSequence("a2", "P1", 130);
  s.CreateSequence("a3", "P1", 2);
  s.CreateSequence("b1", "P2", 17);
  s.CreateSequence("b2", "P2", 600);
  s.CreateSequence("c1", "", 40);
  s.CreateSequence("c2", "", 513);
}

// Head-space queries (layer 1, sq 2) of the mixed scenario's sequences on P1, on P2 and on
// no prefix: a1-a3, b1-b2, c1.
std::vector<OwnedDecodeQuery> MixedHeadQueries(Scenario& s) {
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"a1", "a2", "a3", "b1", "b2", "c1"})
    queries.push_back(s.HeadQuery(id, 1, 2));
  return queries;
}

TEST(EngineTest, MixedBatchMatchesGoldenWithGroupsAboveAndBelowTheThreshold) {
  EngineOptions options = BaseOptions();
  options.max_sq = 2;
  SetThreshold(options, 5.0);  // B_theta(sq = 2) = 2.5: P1's 3 queries go hybrid, P2's 2 do not
  Scenario s(MakeEngine(options));
  BuildMixedScenario(s);
  std::vector<OwnedDecodeQuery> queries = MixedHeadQueries(s);
  queries.push_back(s.LatentQuery("c2", 1, 2));
  queries.push_back(s.LatentQuery("a1", 0, 2));
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ExpectMatchesGolden(s, queries, *answers);

  // Tree-aware: P1's level is read by P1's group (6 query tokens) and P2's (4): 10 >= 5, so
  // one naive pass over P1 serves both; P2's own level (4 tokens) stays in absorb form.
  for (int i : {0, 1, 2}) {
    EXPECT_EQ((*answers)[i].plan.formulation, Formulation::kHybrid) << i;
    EXPECT_EQ((*answers)[i].plan.prefix_id, "P1");
    EXPECT_EQ((*answers)[i].plan.group_size, 3);
    EXPECT_EQ((*answers)[i].plan.naive_tokens, 300);
    EXPECT_EQ((*answers)[i].plan.naive_pass_query_tokens, 10);
  }
  for (int i : {3, 4}) {
    EXPECT_EQ((*answers)[i].plan.formulation, Formulation::kHybrid) << i;
    EXPECT_EQ((*answers)[i].plan.prefix_id, "P2");
    EXPECT_EQ((*answers)[i].plan.naive_tokens, 300);  // P1 only
    EXPECT_EQ((*answers)[i].plan.naive_pass_query_tokens, 10);
  }
  EXPECT_EQ((*answers)[5].plan.formulation, Formulation::kAbsorb);  // no prefix
  EXPECT_EQ((*answers)[7].plan.formulation, Formulation::kAbsorb);  // latent: never hybrid
  EXPECT_DOUBLE_EQ((*answers)[0].plan.b_theta, 2.5);
  EXPECT_EQ((*answers)[0].plan.batch_size, 8);
  EXPECT_EQ(s.engine().Stats().kv.expanded_entries, 1);  // P1's level of layer 1, once
}

// Sequences on the FP8 cache (an FP8 prefix with children sequences, an FP8 sequence of its
// own) beside bf16 ones, in one batch, on the host and on an emulated NPU: every answer within
// SnapMLA's bounds of the fp64 golden on the unquantised rows (bf16 ones within theirs), the
// FP8 prefix's group hybrid with its naive part in bf16 and its absorb part in FP8.
void ExpectFp8ScenarioMatchesGolden(std::vector<std::unique_ptr<AttentionDevice>> devices) {
  EngineOptions options = BaseOptions();
  options.max_sq = 2;
  SetThreshold(options, 2.0);
  Scenario s(MakeEngine(options, std::move(devices)), 11, /*data_scale=*/0.1);
  s.RegisterPrefix("F", "", 300, KvDtype::kFp8);
  s.RegisterPrefix("F2", "F", 100);  // inherits FP8
  s.CreateSequence("f1", "F", 5);
  s.CreateSequence("f2", "F", 260);
  s.CreateSequence("f3", "F2", 40);
  s.CreateSequence("g", "", 700, KvDtype::kFp8);
  s.CreateSequence("b", "", 90);
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"f1", "f2", "f3"}) queries.push_back(s.HeadQuery(id, 1, 1));
  queries.push_back(s.HeadQuery("g", 0, 2));
  queries.push_back(s.LatentQuery("g", 1, 1));
  queries.push_back(s.HeadQuery("b", 1, 1));
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  for (size_t i = 0; i < queries.size(); ++i) {
    const GoldenOutput golden = s.Golden(queries[i]);
    const OwnedAnswer& a = (*answers)[i];
    if (queries[i].sequence_id == "b") {
      EXPECT_EQ(a.plan.absorb_kv_dtype, KvDtype::kBf16);
      EXPECT_TRUE(mlaserve::testing::AllClose(a.out, golden.out, kOutTolerance, true));
      continue;
    }
    EXPECT_EQ(a.plan.absorb_kv_dtype, KvDtype::kFp8) << i;
    const AttentionErrors e = CompareWithGolden(a.out, a.lse, golden);
    EXPECT_LE(e.rel_l2, 5e-2) << queries[i].sequence_id;
    EXPECT_LE(e.cos_dist, 1e-3) << queries[i].sequence_id;
    EXPECT_LE(e.lse_max_err, 2e-2) << queries[i].sequence_id;
  }
  for (int i : {0, 1, 2}) {
    EXPECT_EQ((*answers)[i].plan.formulation, Formulation::kHybrid) << i;
    EXPECT_EQ((*answers)[i].plan.naive_tokens, 300) << i;
  }
  EXPECT_EQ((*answers)[3].plan.formulation, Formulation::kAbsorb);
}

// A tensor-parallel rank's share of the heads: latent queries with fewer or more heads than
// the model's, head-space ones with a range of its heads (hybrid over a prefix and absorb),
// each call against the golden of exactly those heads.
void ExpectHeadSharesMatchGolden(std::vector<std::unique_ptr<AttentionDevice>> devices) {
  EngineOptions options = BaseOptions();
  options.max_sq = 2;
  SetThreshold(options, 1.0);  // every prefix group goes hybrid
  Scenario s(MakeEngine(options, std::move(devices)));
  BuildMixedScenario(s);
  const std::vector<std::vector<OwnedDecodeQuery>> calls = {
      {s.LatentQuery("a1", 0, 2, 3), s.LatentQuery("c2", 1, 1, 3)},
      {s.LatentQuery("b2", 1, 1, 20)},  // more than the model's 8
      {s.HeadQuery("a1", 1, 2, 3, 5), s.HeadQuery("a2", 1, 2, 3, 5), s.HeadQuery("c1", 0, 1, 3, 5)},
      {s.HeadQuery("b1", 0, 1, 1, 7), s.HeadQuery("b2", 0, 1, 1, 7)},  // the last head
  };
  for (size_t c = 0; c < calls.size(); ++c) {
    SCOPED_TRACE(::testing::Message() << "call " << c);
    auto answers = DecodeSync(s.engine(), calls[c]);
    ASSERT_TRUE(answers.ok()) << answers.status();
    ExpectMatchesGolden(s, calls[c], *answers);
    if (c == 2) {  // the range's W_UK/W_UV and its heads of P1's expanded K/V
      EXPECT_EQ((*answers)[0].plan.formulation, Formulation::kHybrid);
      EXPECT_EQ((*answers)[2].plan.formulation, Formulation::kAbsorb);
    }
  }
}

// A pool of emulated devices sharing the host's CPUs (EngineOptions::shared_cpus, the
// server's default): each device has its one thread of its own and runs on up to three when
// the other is idle, and its answers are the golden's as with threads of its own.
TEST(EngineTest, APoolSharingItsCpusMatchesGolden) {
  EngineOptions options = BaseOptions();
  options.max_sq = 2;
  options.shared_cpus = 3;
  options.devices = 2;
  SetThreshold(options, 5.0);
  auto engine = EngineImpl::Create(std::move(options), {});  // the pool the options describe
  ASSERT_TRUE(engine.ok()) << engine.status();
  Scenario s(*std::move(engine));
  ASSERT_EQ(s.engine().Info().devices.size(), 2u);
  for (const DeviceInfo& d : s.engine().Info().devices) EXPECT_EQ(d.host_threads, 1);
  BuildMixedScenario(s);
  std::vector<OwnedDecodeQuery> queries = MixedHeadQueries(s);
  queries.push_back(s.LatentQuery("c2", 1, 2));
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ExpectMatchesGolden(s, queries, *answers);
}

TEST(EngineTest, HeadSharesMatchGoldenOnTheHost) { ExpectHeadSharesMatchGolden({}); }

TEST(EngineTest, HeadSharesMatchGoldenOnAnEmulatedNpu) {
  auto devices = OneEmulatedNpu();
  ASSERT_TRUE(devices.ok()) << devices.status();
  ExpectHeadSharesMatchGolden(*std::move(devices));
}

TEST(EngineTest, Fp8SequencesBesideBf16OnesMatchGoldenOnTheHost) {
  ExpectFp8ScenarioMatchesGolden({});
}

TEST(EngineTest, Fp8SequencesBesideBf16OnesMatchGoldenOnAnEmulatedNpu) {
  auto devices = OneEmulatedNpu();
  ASSERT_TRUE(devices.ok()) << devices.status();
  ExpectFp8ScenarioMatchesGolden(*std::move(devices));
}

// Flat grouping, as before tree-aware TyphoonMLA: each group decides alone, so P2's group
// (2 queries < B_theta(2) = 2.5) runs absorb-only and P1's repeats nothing it shares.
TEST(EngineTest, FlatGroupingDecidesPerGroup) {
  EngineOptions options = BaseOptions();
  options.max_sq = 2;
  options.tree_aware_grouping = false;
  SetThreshold(options, 5.0);
  Scenario s(MakeEngine(options));
  BuildMixedScenario(s);
  std::vector<OwnedDecodeQuery> queries = MixedHeadQueries(s);
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ExpectMatchesGolden(s, queries, *answers);
  for (int i : {0, 1, 2}) {
    EXPECT_EQ((*answers)[i].plan.formulation, Formulation::kHybrid) << i;
    EXPECT_EQ((*answers)[i].plan.naive_pass_query_tokens, 6);
  }
  for (int i : {3, 4}) EXPECT_EQ((*answers)[i].plan.formulation, Formulation::kAbsorb) << i;
}

// With TyphoonMLA off, the batch that runs P1's groups hybrid above runs every group
// absorb-only, expands no prefix, and still answers as the golden does.
TEST(EngineTest, TyphoonOffRunsEveryGroupAbsorbOnly) {
  EngineOptions options = BaseOptions();
  options.max_sq = 2;
  SetThreshold(options, 5.0);
  options.typhoon = false;
  Scenario s(MakeEngine(options));
  BuildMixedScenario(s);
  std::vector<OwnedDecodeQuery> queries = MixedHeadQueries(s);
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ExpectMatchesGolden(s, queries, *answers);
  for (size_t i = 0; i < queries.size(); ++i) {
    EXPECT_EQ((*answers)[i].plan.formulation, Formulation::kAbsorb) << i;
    EXPECT_EQ((*answers)[i].plan.naive_tokens, 0) << i;
  }
  EXPECT_TRUE(std::isinf((*answers)[0].plan.b_theta));
  EXPECT_TRUE(std::isinf(s.engine().Info().b_theta_by_sq.front()));
  EXPECT_EQ(s.engine().Stats().kv.expanded_entries, 0);
}

// Two groups on children of P: flat grouping would give each its own pass over P (and none
// clears the bar alone); tree-aware grouping shares one pass over P, and each child runs
// naive only if its own readers clear it.
TEST(EngineTest, GroupsOnSiblingPrefixesShareTheirParentsPass) {
  EngineOptions options = BaseOptions();
  SetThreshold(options, 4.0);
  Scenario s(MakeEngine(options));
  s.RegisterPrefix("P", "", 200);
  s.RegisterPrefix("C1", "P", 64);
  s.RegisterPrefix("C2", "P", 80);
  for (const char* id : {"x1", "x2", "x3"}) s.CreateSequence(id, "C1", 7);
  for (const char* id : {"y1", "y2"}) s.CreateSequence(id, "C2", 3);
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"x1", "x2", "x3", "y1", "y2"}) queries.push_back(s.HeadQuery(id, 0, 1));
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ExpectMatchesGolden(s, queries, *answers);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ((*answers)[i].plan.formulation, Formulation::kHybrid) << i;
    EXPECT_EQ((*answers)[i].plan.naive_pass_query_tokens, 5) << i;  // P's pass: all five
    EXPECT_EQ((*answers)[i].plan.naive_tokens, 200) << i;           // neither child: 3, 2 < 4
  }
  EXPECT_EQ(s.engine().Stats().kv.expanded_entries, 1);
}

TEST(EngineTest, BadOptionsAreRefusedNamingTheOption) {
  struct Case {
    std::function<void(EngineOptions&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](EngineOptions& o) { o.max_batch = 0; }, "max_batch"},
      {[](EngineOptions& o) { o.preload = 3; }, "preload = 3"},
      {[](EngineOptions& o) { o.devices = 0; }, "devices"},
      {[](EngineOptions& o) { o.profile = "no-such-npu"; }, "profile 'no-such-npu'"},
  };
  for (const Case& c : cases) {
    EngineOptions options = BaseOptions();
    c.edit(options);
    auto engine = CreateEngine(std::move(options));
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(engine.status().message(), HasSubstr(c.message));
  }
}

TEST(EngineTest, WithoutARooflineEveryGroupRunsAbsorbOnly) {
  // The host device has no matrix rate or bandwidth: B_theta is infinite unless overridden.
  EngineOptions options = BaseOptions();
  Scenario s(MakeEngine(options));
  EXPECT_TRUE(std::isinf(s.engine().Info().b_theta_by_sq[0]));
  s.RegisterPrefix("P", "", 40);
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"u", "v", "w", "x"}) {
    s.CreateSequence(id, "P", 3);
    queries.push_back(s.HeadQuery(id, 0, 1));
  }
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  for (const OwnedAnswer& a : *answers) EXPECT_EQ(a.plan.formulation, Formulation::kAbsorb);
  ExpectMatchesGolden(s, queries, *answers);
}

TEST(EngineTest, HybridOverAPrefixChainMatchesGolden) {
  EngineOptions options = BaseOptions();
  SetThreshold(options, 1.0);  // every prefix group goes hybrid
  Scenario s(MakeEngine(options));
  BuildMixedScenario(s);
  std::vector<OwnedDecodeQuery> queries = {s.HeadQuery("b1", 0, 1), s.HeadQuery("b2", 0, 1),
                                           s.HeadQuery("a2", 0, 1)};
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  EXPECT_EQ((*answers)[0].plan.formulation, Formulation::kHybrid);
  EXPECT_EQ((*answers)[0].plan.prefix_id, "P2");  // two levels: P1's tokens and P2's
  ExpectMatchesGolden(s, queries, *answers);
}

TEST(EngineTest, HybridAgreesWithAbsorbOnlyToBf16Rounding) {
  std::vector<std::vector<float>> outs;
  for (double threshold : {1.0, 1e9}) {
    EngineOptions options = BaseOptions();
    options.max_sq = 2;
    SetThreshold(options, threshold);
    Scenario s(MakeEngine(options), /*seed=*/42);  // same data both times
    BuildMixedScenario(s);
    std::vector<OwnedDecodeQuery> queries = {s.HeadQuery("a1", 1, 2), s.HeadQuery("a2", 1, 2),
                                             s.HeadQuery("a3", 1, 2)};
    auto answers = DecodeSync(s.engine(), queries);
    ASSERT_TRUE(answers.ok()) << answers.status();
    EXPECT_EQ((*answers)[0].plan.formulation,
              threshold < 10 ? Formulation::kHybrid : Formulation::kAbsorb);
    std::vector<float> all;
    for (const auto& a : *answers) all.insert(all.end(), a.out.begin(), a.out.end());
    outs.push_back(std::move(all));
  }
  constexpr mlaserve::testing::Tolerance kPair{2 * kOutTolerance.abs_tol, 2 * 2.01 / 128, 4e-5};
  EXPECT_TRUE(mlaserve::testing::AllCloseF(outs[0], outs[1], kPair));
}

}  // namespace
}  // namespace mlaserve::engine
