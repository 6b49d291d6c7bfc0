// What a call to the engine sees: appends carried by queries, refusals naming the field,
// batching of concurrent calls, scales kept apart, expiry, device failures, a full queue.
#include <atomic>
#include <future>
#include <latch>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine_impl.h"
#include "tests/server/engine/engine_scenario.h"
#include "tests/server/engine/engine_test_devices.h"
#include "tests/testing/attention_checks.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::BaseOptions;
using ::mlaserve::engine::testing::DecodeSync;
using ::mlaserve::engine::testing::ExpectMatchesGolden;
using ::mlaserve::engine::testing::FirstBatchHeld;
using ::mlaserve::engine::testing::kLseTolerance;
using ::mlaserve::engine::testing::kOutTolerance;
using ::mlaserve::engine::testing::MakeEngine;
using ::mlaserve::engine::testing::OwnedAnswer;
using ::mlaserve::engine::testing::Scenario;
using ::mlaserve::engine::testing::ScriptedDevice;
using ::testing::HasSubstr;

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
