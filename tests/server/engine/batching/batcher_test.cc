#include "server/engine/batching/batcher.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::engine {
namespace {

using ::testing::ElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1000);
const absl::Duration kWait = absl::Microseconds(500);

TEST(BatchPolicyTest, CutsAtOnceForAnIdleDeviceAndOtherwiseWaitsUpToMaxWait) {
  const BatchPolicy policy{.max_batch = 8, .max_wait = kWait};
  const BatchPolicy::Devices idle{1, true}, busy{0, true}, full{0, false};
  // Nothing waiting: nothing to cut.
  EXPECT_FALSE(policy.Decide(kT0, kT0, 0, idle).cut);
  // A device idle: at once, whatever the wait.
  EXPECT_TRUE(policy.Decide(kT0, kT0, 1, idle).cut);
  // All busy with room: coalesce until the oldest has waited max_wait ...
  const auto early = policy.Decide(kT0 + absl::Microseconds(100), kT0, 3, busy);
  EXPECT_FALSE(early.cut);
  EXPECT_EQ(early.recheck, kT0 + kWait);
  EXPECT_TRUE(policy.Decide(kT0 + kWait, kT0, 3, busy).cut);
  // ... or the batch is full.
  EXPECT_TRUE(policy.Decide(kT0, kT0, 8, busy).cut);
  // No room anywhere: wait for a device, not for time.
  const auto blocked = policy.Decide(kT0 + absl::Seconds(5), kT0, 8, full);
  EXPECT_FALSE(blocked.cut);
  EXPECT_EQ(blocked.recheck, absl::InfiniteFuture());
}

// A batcher driven by hand on a fake clock: no threads, no sleeps.
class ManualBatcherTest : public ::testing::Test {
 protected:
  std::unique_ptr<Batcher> Make(int max_batch, int max_queue = 64) {
    return Batcher::Manual(
        {{max_batch, kWait}, max_queue},
        [this](std::vector<PendingCall> calls) {
          std::vector<int> sizes;
          for (PendingCall& call : calls) {
            sizes.push_back(static_cast<int>(call.queries.size()));
            std::move(call.done)(std::span<const DecodeAnswer>());
          }
          batches_.push_back(sizes);
        },
        [this] { return devices_; });
  }
  // A call of `queries` queries submitted at `at`.
  PendingCall Call(int queries, absl::Time at) {
    PendingCall call;
    call.queries.resize(queries);
    call.submitted = at;
    call.done = [this](absl::StatusOr<std::span<const DecodeAnswer>>) { ++answered_; };
    return call;
  }
  void Enqueue(Batcher& b, int queries, absl::Time at, float softmax_scale = 0) {
    PendingCall call = Call(queries, at);
    call.key.softmax_scale = softmax_scale;
    ASSERT_TRUE(b.Enqueue(call).ok());
  }

  BatchPolicy::Devices devices_{0, true};
  std::vector<std::vector<int>> batches_;  // call sizes per batch
  int answered_ = 0;
};

TEST_F(ManualBatcherTest, ALoneCallGoesToAnIdleDeviceAtOnce) {
  auto b = Make(8);
  devices_ = {1, true};
  Enqueue(*b, 1, kT0);
  b->Step(kT0);
  EXPECT_THAT(batches_, ElementsAre(ElementsAre(1)));
}

TEST_F(ManualBatcherTest, WhileDevicesAreBusyCallsCoalesceUntilMaxWait) {
  auto b = Make(8);
  Enqueue(*b, 1, kT0);
  Enqueue(*b, 2, kT0 + absl::Microseconds(100));
  Enqueue(*b, 1, kT0 + absl::Microseconds(200));
  EXPECT_EQ(b->Step(kT0 + absl::Microseconds(400)), kT0 + kWait);  // not yet: told when
  EXPECT_TRUE(batches_.empty());
  b->Step(kT0 + kWait);
  EXPECT_THAT(batches_, ElementsAre(ElementsAre(1, 2, 1)));
  EXPECT_EQ(b->queued(), 0);
}

TEST_F(ManualBatcherTest, AFullBatchIsCutBeforeMaxWaitAndNeverSplitsACall) {
  auto b = Make(4);
  Enqueue(*b, 3, kT0);
  Enqueue(*b, 3, kT0);
  Enqueue(*b, 1, kT0);
  b->Step(kT0);  // 7 waiting >= 4: cut, calls whole, at most 4 queries per batch
  EXPECT_THAT(batches_, ElementsAre(ElementsAre(3), ElementsAre(3, 1)));
}

// A device batch applies one softmax scale: the oldest call's scale decides the batch, the
// calls with another keep their order for the next ones.
TEST_F(ManualBatcherTest, CallsOfAnotherSoftmaxScaleWaitInOrderForTheNextBatch) {
  auto b = Make(8);
  devices_ = {0, false};
  Enqueue(*b, 1, kT0, 0.5f);
  Enqueue(*b, 2, kT0, 0.25f);
  Enqueue(*b, 3, kT0, 0.5f);
  Enqueue(*b, 4, kT0, 0.25f);
  Enqueue(*b, 5, kT0);
  Enqueue(*b, 6, kT0, 0.5f);  // would overflow the first batch (1 + 3 + 6 > 8)
  devices_ = {1, true};
  b->Step(kT0);
  EXPECT_THAT(batches_,
              ElementsAre(ElementsAre(1, 3), ElementsAre(2, 4), ElementsAre(5), ElementsAre(6)));
  EXPECT_EQ(b->queued(), 0);
  EXPECT_EQ(answered_, 6);
}

TEST_F(ManualBatcherTest, WithoutRoomNothingIsCutUntilADeviceFrees) {
  auto b = Make(4);
  devices_ = {0, false};
  for (int i = 0; i < 6; ++i) Enqueue(*b, 1, kT0);
  EXPECT_EQ(b->Step(kT0 + absl::Seconds(10)), absl::InfiniteFuture());
  EXPECT_TRUE(batches_.empty());
  devices_ = {1, true};  // a device finished: everything waiting goes, max_batch at a time
  b->Step(kT0 + absl::Seconds(10));
  EXPECT_THAT(batches_, ElementsAre(ElementsAre(1, 1, 1, 1), ElementsAre(1, 1)));
}

TEST_F(ManualBatcherTest, AFullQueueRefusesAndAStoppedOneRunsWhatItHolds) {
  auto b = Make(4, /*max_queue=*/5);
  Enqueue(*b, 3, kT0);
  PendingCall big = Call(3, kT0);
  const absl::Status full = b->Enqueue(big);
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(answered_, 0);  // handed back untouched
  b->Stop();
  PendingCall late = Call(1, kT0);
  EXPECT_EQ(b->Enqueue(late).code(), absl::StatusCode::kUnavailable);
  devices_ = {0, false};
  b->Shutdown();  // stopping cuts regardless of the devices
  EXPECT_THAT(batches_, ElementsAre(ElementsAre(3)));
  EXPECT_EQ(answered_, 1);
}

}  // namespace
}  // namespace mlaserve::engine
