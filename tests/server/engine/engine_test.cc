#include <atomic>
#include <cmath>
#include <functional>
#include <future>
#include <latch>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/mla/fp8_accuracy.h"
#include "server/engine/devices/host_attention_device.h"
#include "server/engine/devices/npu_attention_device.h"
#include "server/engine/engine_impl.h"
#include "tests/server/engine/engine_scenario.h"
#include "tests/testing/attention_checks.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::DecodeSync;
using ::mlaserve::engine::testing::ExpectMatchesGolden;
using ::mlaserve::engine::testing::OwnedAnswer;
using ::mlaserve::engine::testing::Scenario;
using ::mlaserve::engine::testing::SetThreshold;
using ::mlaserve::engine::testing::SmallModel;
using ::testing::HasSubstr;

using ::mlaserve::engine::testing::kLseTolerance;
using ::mlaserve::engine::testing::kOutTolerance;

EngineOptions BaseOptions() {
  EngineOptions o;
  o.model = SmallModel();
  o.weights.seed = 7;
  o.kv.budget_bytes = int64_t{256} << 20;
  o.kv.page_size = 16;
  o.max_wait = absl::Microseconds(200);
  return o;
}

// A device whose runs a test scripts: it blocks until released, fails, or delegates to the host.
class ScriptedDevice : public AttentionDevice {
 public:
  MOCK_METHOD(absl::StatusOr<DeviceRun>, Run, (const BatchSteps&), (override));
  const DeviceInfo& info() const override { return info_; }
  DeviceInfo info_{"scripted", 1, 1, 0, 0};
};

// The engine's default device, one emulated Ascend 910 die, with two host threads.
absl::StatusOr<std::vector<std::unique_ptr<AttentionDevice>>> OneEmulatedNpu() {
  ASSIGN_OR_RETURN(const npu::DeviceProfile profile, npu::LoadDeviceProfile("ascend910-die"));
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionDevice> device,
                   NpuAttentionDevice::Create(profile, {.host_threads = 2}));
  std::vector<std::unique_ptr<AttentionDevice>> devices;
  devices.push_back(std::move(device));
  return devices;
}

// One device that holds its first batch until Release() and runs every batch on the host:
// calls made meanwhile queue behind it. Must outlive the engine given Devices().
class FirstBatchHeld {
 public:
  std::vector<std::unique_ptr<AttentionDevice>> Devices() {
    auto device = std::make_unique<::testing::NiceMock<ScriptedDevice>>();
    ON_CALL(*device, Run).WillByDefault([this](const BatchSteps& steps) {
      if (runs_.fetch_add(1) == 0) release_.wait();
      return host_.Run(steps);
    });
    std::vector<std::unique_ptr<AttentionDevice>> devices;
    devices.push_back(std::move(device));
    return devices;
  }
  void Release() { release_.count_down(); }

 private:
  std::latch release_{1};
  std::atomic<int> runs_{0};
  HostAttentionDevice host_;
};

std::unique_ptr<EngineImpl> MakeEngine(EngineOptions options,
                                       std::vector<std::unique_ptr<AttentionDevice>> devices = {}) {
  if (devices.empty()) devices.push_back(std::make_unique<HostAttentionDevice>());
  auto engine = EngineImpl::Create(std::move(options), std::move(devices));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

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

TEST(EngineTest, MixedBatchMatchesGoldenWithGroupsAboveAndBelowTheThreshold) {
  EngineOptions options = BaseOptions();
  options.max_sq = 2;
  SetThreshold(options, 5.0);  // B_theta(sq = 2) = 2.5: P1's 3 queries go hybrid, P2's 2 do not
  Scenario s(MakeEngine(options));
  BuildMixedScenario(s);
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"a1", "a2", "a3", "b1", "b2", "c1"})
    queries.push_back(s.HeadQuery(id, 1, 2));
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
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"a1", "a2", "a3", "b1", "b2", "c1"})
    queries.push_back(s.HeadQuery(id, 1, 2));
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ExpectMatchesGolden(s, queries, *answers);
  for (int i : {0, 1, 2}) {
    EXPECT_EQ((*answers)[i].plan.formulation, Formulation::kHybrid) << i;
    EXPECT_EQ((*answers)[i].plan.naive_pass_query_tokens, 6);
  }
  for (int i : {3, 4}) EXPECT_EQ((*answers)[i].plan.formulation, Formulation::kAbsorb) << i;
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

TEST(EngineTest, AppendCarriedByAQueryIsSeenAndIdempotentOnRetry) {
  Scenario s(MakeEngine(BaseOptions()));
  s.CreateSequence("x", "", 33);
  OwnedDecodeQuery q = s.HeadQuery("x", 0, 1);
  s.AttachAppend(q, 1);
  auto first = DecodeSync(s.engine(), {q});
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectMatchesGolden(s, {q}, *first);
  auto retry = DecodeSync(s.engine(), {q});  // same position: the append is a no-op
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ((*retry)[0].out, (*first)[0].out);
  EXPECT_EQ(s.engine().GetSequence("x")->lengths[0], 34);
}

// Finite bf16 inputs far outside a model's range make fp32 scores overflow; the answer would
// read as "saw no key" (out 0, lse -inf), so the call is refused instead.
TEST(EngineTest, ScoresThatOverflowFp32AreRefusedNotAnsweredAsNoKey) {
  for (const bool npu : {false, true}) {
    std::vector<std::unique_ptr<AttentionDevice>> devices;
    if (npu) {
      auto profile = npu::LoadDeviceProfile("ascend910-die");
      ASSERT_TRUE(profile.ok()) << profile.status();
      auto device = NpuAttentionDevice::Create(*profile, {.host_threads = 1});
      ASSERT_TRUE(device.ok()) << device.status();
      devices.push_back(std::move(*device));
    }
    Scenario s(MakeEngine(BaseOptions(), std::move(devices)), /*seed=*/3, /*data_scale=*/1e22);
    s.CreateSequence("x", "", 20);
    for (const OwnedDecodeQuery& q : {s.HeadQuery("x", 0, 1), s.LatentQuery("x", 0, 2)}) {
      auto r = DecodeSync(s.engine(), {q});
      ASSERT_FALSE(r.ok()) << (npu ? "npu" : "host");
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(r.status().message(), HasSubstr("queries[0]: token 0 head 0: attention scores "
                                                  "overflow fp32"));
    }
  }
}

// Calls that arrive while the device is busy coalesce (up to max_wait) into one batch, and
// their queries on one prefix into one group.
TEST(EngineTest, QueriesFromConcurrentCallsShareABatchAndAGroup) {
  FirstBatchHeld held;  // outlives the engine
  EngineOptions options = BaseOptions();
  options.max_wait = absl::Milliseconds(300);
  options.max_batch = 2;
  Scenario s(MakeEngine(options, held.Devices()));
  s.RegisterPrefix("P", "", 50);
  s.CreateSequence("u", "P", 3);
  s.CreateSequence("v", "P", 4);
  s.CreateSequence("w", "", 4);
  const OwnedDecodeQuery qu = s.HeadQuery("u", 0, 1), qv = s.HeadQuery("v", 0, 1),
                         qw = s.HeadQuery("w", 0, 1);
  auto fw = std::async(std::launch::async, [&] { return DecodeSync(s.engine(), {qw}); });
  while (s.engine().Stats().batches < 1) std::this_thread::yield();  // w holds the device
  auto fu = std::async(std::launch::async, [&] { return DecodeSync(s.engine(), {qu}); });
  auto fv = std::async(std::launch::async, [&] { return DecodeSync(s.engine(), {qv}); });
  while (s.engine().Stats().batches < 2) std::this_thread::yield();
  held.Release();
  auto au = fu.get(), av = fv.get();
  ASSERT_TRUE(au.ok() && av.ok() && fw.get().ok());
  EXPECT_EQ((*au)[0].plan.batch_size, 2);
  EXPECT_EQ((*av)[0].plan.group_size, 2);
  EXPECT_EQ(s.engine().Stats().batches, 2);
}

// FlashMLA's callers pass their own scale: each call is answered with its own, applied as
// the model's is, and a batch never mixes two.
TEST(EngineTest, EachCallGetsItsOwnSoftmaxScaleAndScalesAreBatchedApart) {
  FirstBatchHeld held;  // outlives the engine
  EngineOptions options = BaseOptions();
  options.max_wait = absl::Seconds(60);  // nothing is cut until the device frees up
  options.max_batch = 8;
  Scenario s(MakeEngine(options, held.Devices()));
  const float model_scale = s.engine().Info().model.softmax_scale;
  s.RegisterPrefix("P", "", 70);
  for (const char* id : {"u", "v", "x", "w"}) s.CreateSequence(id, "P", 9);
  s.CreateSequence("y", "", 33);
  const OwnedDecodeQuery qw = s.HeadQuery("w", 0, 1);
  auto fw = std::async(std::launch::async, [&] { return DecodeSync(s.engine(), {qw}); });
  while (s.engine().Stats().batches < 1) std::this_thread::yield();  // w holds the device

  struct Call {
    OwnedDecodeQuery query;
    std::optional<float> scale;
  };
  const std::vector<Call> calls = {{s.HeadQuery("u", 0, 2), 2 * model_scale},
                                   {s.LatentQuery("v", 0, 1), 2 * model_scale},
                                   {s.HeadQuery("x", 1, 1), 0.25f * model_scale},
                                   {s.LatentQuery("y", 1, 2), std::nullopt}};
  std::vector<std::future<absl::StatusOr<std::vector<OwnedAnswer>>>> futures;
  for (const Call& c : calls) {
    futures.push_back(std::async(std::launch::async, [&s, &c] {
      DecodeOptions o;
      o.softmax_scale = c.scale;
      return DecodeSync(s.engine(), {c.query}, std::move(o));
    }));
  }
  while (s.engine().Stats().queued < 4) std::this_thread::yield();
  held.Release();
  ASSERT_TRUE(fw.get().ok());
  const std::vector<int> batch_sizes = {2, 2, 1, 1};
  for (size_t i = 0; i < calls.size(); ++i) {
    auto answers = futures[i].get();
    ASSERT_TRUE(answers.ok()) << answers.status();
    const OwnedAnswer& a = (*answers)[0];
    EXPECT_EQ(a.plan.batch_size, batch_sizes[i]) << "call " << i;
    const GoldenOutput golden = s.Golden(calls[i].query, calls[i].scale);
    EXPECT_TRUE(mlaserve::testing::AllClose(a.out, golden.out, kOutTolerance, true)) << i;
    EXPECT_TRUE(mlaserve::testing::AllClose(a.lse, golden.lse, kLseTolerance, false)) << i;
    if (calls[i].scale.has_value()) {
      // The scale mattered: the model's would have given another answer.
      EXPECT_FALSE(
          mlaserve::testing::AllClose(a.lse, s.Golden(calls[i].query).lse, kLseTolerance, false))
          << i;
    }
  }
}

TEST(EngineTest, BadSoftmaxScalesAreRefusedNamingTheField) {
  Scenario s(MakeEngine(BaseOptions()));
  s.CreateSequence("a", "", 5);
  const OwnedDecodeQuery q = s.LatentQuery("a", 0, 1);
  for (const float scale : {0.0f, -0.1f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()}) {
    DecodeOptions o;
    o.softmax_scale = scale;
    auto answers = DecodeSync(s.engine(), {q}, std::move(o));
    EXPECT_EQ(answers.status().code(), absl::StatusCode::kInvalidArgument) << scale;
    EXPECT_THAT(std::string(answers.status().message()), ::testing::StartsWith("softmax_scale: "))
        << scale;
  }
  EXPECT_EQ(s.engine().Stats().batches, 0);
}

TEST(EngineTest, BadQueriesAreRejectedNamingTheFieldAndChangeNothing) {
  EngineOptions options = BaseOptions();
  options.max_batch = 4;
  Scenario s(MakeEngine(options));
  s.CreateSequence("x", "", 10);
  auto expect = [&](std::vector<OwnedDecodeQuery> queries, absl::StatusCode code,
                    const char* text) {
    auto r = DecodeSync(s.engine(), std::move(queries));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(text));
  };
  expect({}, absl::StatusCode::kInvalidArgument, "queries: empty");
  expect(std::vector<OwnedDecodeQuery>(5, s.HeadQuery("x", 0, 1)),
         absl::StatusCode::kInvalidArgument, "max_batch");
  OwnedDecodeQuery q = s.HeadQuery("x", 0, 1);
  q.layer = 2;
  expect({q}, absl::StatusCode::kInvalidArgument, "queries[0].layer");
  q = s.HeadQuery("x", 0, 1);
  q.sq = 5;
  expect({q}, absl::StatusCode::kInvalidArgument, "queries[0].sq");
  q = s.HeadQuery("x", 0, 1);
  q.q_pe.pop_back();
  expect({q}, absl::StatusCode::kInvalidArgument, "queries[0].head.q_pe");
  q = s.HeadQuery("x", 0, 1);
  q.q_nope[3] = Bf16::FromBits(0x7fc0);
  expect({q}, absl::StatusCode::kInvalidArgument, "NaN");
  expect({s.HeadQuery("x", 0, 1), s.HeadQuery("x", 0, 1)}, absl::StatusCode::kInvalidArgument,
         "twice");
  expect({s.HeadQuery("nope", 0, 1)}, absl::StatusCode::kNotFound, "queries[0].sequence_id");
  q = s.HeadQuery("x", 0, 1);
  q.append_rows = s.RandomRows(1);
  q.append_position = 12;  // beyond the sequence's end (10): a gap
  expect({q}, absl::StatusCode::kFailedPrecondition, "queries[0] append");
  EXPECT_EQ(s.engine().GetSequence("x")->lengths[0], 10);
  EXPECT_EQ(s.engine().Stats().batches, 0);  // the append failure never reached a device
}

TEST(EngineTest, ExpiredAndCancelledCallsAreAnsweredWithoutWork) {
  Scenario s(MakeEngine(BaseOptions()));
  s.CreateSequence("x", "", 10);
  DecodeOptions late;
  late.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_EQ(DecodeSync(s.engine(), {s.HeadQuery("x", 0, 1)}, late).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  DecodeOptions cancelled;
  cancelled.cancelled = [] { return true; };
  EXPECT_EQ(DecodeSync(s.engine(), {s.HeadQuery("x", 0, 1)}, cancelled).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(s.engine().Stats().batches, 0);
}

TEST(EngineTest, ADeviceFailureFailsOnlyItsBatch) {
  auto device = std::make_unique<::testing::StrictMock<ScriptedDevice>>();
  auto host = std::make_shared<HostAttentionDevice>();
  EXPECT_CALL(*device, Run)
      .WillOnce(::testing::Return(absl::InternalError("device 0 lost its HBM")))
      .WillOnce([host](const BatchSteps& steps) { return host->Run(steps); });
  std::vector<std::unique_ptr<AttentionDevice>> devices;
  devices.push_back(std::move(device));
  Scenario s(MakeEngine(BaseOptions(), std::move(devices)));
  s.CreateSequence("x", "", 10);
  auto failed = DecodeSync(s.engine(), {s.HeadQuery("x", 0, 1)});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failed.status().message(), HasSubstr("lost its HBM"));
  const OwnedDecodeQuery q = s.HeadQuery("x", 0, 1);
  auto next = DecodeSync(s.engine(), {q});
  ASSERT_TRUE(next.ok()) << next.status();
  ExpectMatchesGolden(s, {q}, *next);
}

TEST(EngineTest, AFullQueueRefusesAtOnceAndDrainWaitsForWorkInFlight) {
  std::latch release(1);
  auto device = std::make_unique<::testing::NiceMock<ScriptedDevice>>();
  auto host = std::make_shared<HostAttentionDevice>();
  ON_CALL(*device, Run).WillByDefault([&release, host](const BatchSteps& steps) {
    release.wait();
    return host->Run(steps);
  });
  std::vector<std::unique_ptr<AttentionDevice>> devices;
  devices.push_back(std::move(device));
  EngineOptions options = BaseOptions();
  options.max_batch = 1;
  options.max_queue = 1;
  options.max_wait = absl::ZeroDuration();
  Scenario s(MakeEngine(options, std::move(devices)));
  for (const char* id : {"x", "y", "z", "w"}) s.CreateSequence(id, "", 10);
  std::atomic<int> answered{0};
  auto count = [&answered](absl::StatusOr<std::span<const DecodeAnswer>> r) {
    EXPECT_TRUE(r.ok()) << r.status();
    ++answered;
  };
  // The device holds two batches (one running, one waiting); the third call waits in the
  // batcher's queue, which then is full.
  const OwnedDecodeQuery x = s.HeadQuery("x", 0, 1), y = s.HeadQuery("y", 0, 1),
                         z = s.HeadQuery("z", 0, 1);
  const ModelConfig& m = s.model();
  s.engine().Decode({x.View(m)}, {}, count);
  while (s.engine().Stats().batches < 1) std::this_thread::yield();
  s.engine().Decode({y.View(m)}, {}, count);
  while (s.engine().Stats().batches < 2) std::this_thread::yield();
  s.engine().Decode({z.View(m)}, {}, count);
  EXPECT_EQ(s.engine().Stats().queued, 1);
  auto refused = DecodeSync(s.engine(), {s.HeadQuery("w", 0, 1)});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("queue full"));

  EXPECT_EQ(s.engine().Drain(absl::Now() + absl::Milliseconds(50)).code(),
            absl::StatusCode::kDeadlineExceeded);  // still blocked
  EXPECT_EQ(DecodeSync(s.engine(), {s.HeadQuery("w", 0, 1)}).status().code(),
            absl::StatusCode::kUnavailable);  // draining: no new work
  release.count_down();
  EXPECT_TRUE(s.engine().Drain(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_EQ(answered.load(), 3);
  EXPECT_EQ(s.engine().Stats().batches, 3);
}

TEST(EngineTest, CallsArrivingWhileTheDeviceIsBusyJoinOneBatch) {
  std::latch release(1);
  std::atomic<int> runs{0};
  auto device = std::make_unique<::testing::NiceMock<ScriptedDevice>>();
  auto host = std::make_shared<HostAttentionDevice>();
  ON_CALL(*device, Run).WillByDefault([&](const BatchSteps& steps) {
    if (runs.fetch_add(1) < 2) release.wait();
    return host->Run(steps);
  });
  std::vector<std::unique_ptr<AttentionDevice>> devices;
  devices.push_back(std::move(device));
  EngineOptions options = BaseOptions();
  options.max_batch = 8;
  options.max_wait = absl::ZeroDuration();
  Scenario s(MakeEngine(options, std::move(devices)));
  for (int i = 0; i < 7; ++i) s.CreateSequence(absl::StrCat("s", i), "", 10);
  std::vector<OwnedDecodeQuery> queries;
  for (int i = 0; i < 7; ++i) queries.push_back(s.HeadQuery(absl::StrCat("s", i), 0, 1));
  std::mutex mu;
  std::vector<int> batch_sizes;  // by call
  std::atomic<int> answered{0};
  auto count = [&](absl::StatusOr<std::span<const DecodeAnswer>> r) {
    ASSERT_TRUE(r.ok()) << r.status();
    std::lock_guard lock(mu);
    batch_sizes.push_back(r->front().plan.batch_size);
    ++answered;
  };
  const ModelConfig& m = s.model();
  s.engine().Decode({queries[0].View(m)}, {}, count);
  while (s.engine().Stats().batches < 1) std::this_thread::yield();
  s.engine().Decode({queries[1].View(m)}, {}, count);
  while (s.engine().Stats().batches < 2) std::this_thread::yield();
  for (int i = 2; i < 7; ++i) s.engine().Decode({queries[i].View(m)}, {}, count);
  EXPECT_EQ(s.engine().Stats().queued, 5);  // both device slots taken: nothing is cut
  release.count_down();
  EXPECT_TRUE(s.engine().Drain(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_EQ(answered.load(), 7);
  EXPECT_EQ(batch_sizes, (std::vector<int>{1, 1, 5, 5, 5, 5, 5}));
}

// Adaptive batching: with a device idle a lone query is cut at once, however long max_wait
// allows a batch to wait while the devices are busy.
TEST(EngineTest, ALoneQueryOnAnIdleDeviceDoesNotWaitForCompany) {
  EngineOptions options = BaseOptions();
  options.max_wait = absl::Hours(1);
  Scenario s(MakeEngine(options));
  s.CreateSequence("x", "", 10);
  const absl::Time start = absl::Now();
  auto answers = DecodeSync(s.engine(), {s.HeadQuery("x", 0, 1)});
  ASSERT_TRUE(answers.ok()) << answers.status();
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));
  EXPECT_LT((*answers)[0].plan.queue_us, 60e6);
}

}  // namespace
}  // namespace mlaserve::engine
