#include "server/engine/devices/device_pool.h"

#include <latch>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A device of two host threads that notes what the pool lends it before each batch.
class LendRecordingDevice : public AttentionDevice {
 public:
  const DeviceInfo& info() const override { return info_; }
  absl::StatusOr<DeviceRun> Run(const BatchSteps&) override {
    return absl::UnimplementedError("not run");
  }
  void LendCpus(int cpus) override {
    std::lock_guard<std::mutex> lock(mu_);
    lent_.push_back(cpus);
  }
  std::vector<int> lent() {
    std::lock_guard<std::mutex> lock(mu_);
    return lent_;
  }

 private:
  DeviceInfo info_{"recording", /*host_threads=*/2, 1, 0, 0};
  std::mutex mu_;
  std::vector<int> lent_;
};

struct RecordingPool {
  explicit RecordingPool(bool lend) {
    std::vector<std::unique_ptr<AttentionDevice>> owned;
    for (int i = 0; i < 3; ++i) {
      auto device = std::make_unique<LendRecordingDevice>();
      devices.push_back(device.get());
      owned.push_back(std::move(device));
    }
    pool = std::make_unique<DevicePool>(std::move(owned), lend);
  }
  // Runs one batch and waits for it.
  int RunOne() {
    const int idle_before = pool->occupancy().idle;
    std::latch done(1);
    int ran_on = -1;
    pool->Submit([&](AttentionDevice&, int index) {
      ran_on = index;
      done.count_down();
    });
    done.wait();
    // The pool counts the batch done just after it returns.
    while (pool->occupancy().idle < idle_before) std::this_thread::yield();
    return ran_on;
  }
  std::vector<LendRecordingDevice*> devices;
  std::unique_ptr<DevicePool> pool;
};

// A lone batch borrows both idle devices' two threads. With device 0 busy, a batch on device
// 1 makes the idle threads (device 2's) shared by the two, and when it ends device 0 gets
// them all back.
TEST(DevicePoolTest, ABatchBorrowsTheThreadsOfTheDevicesThatAreIdle) {
  std::latch release(1), started(1);  // outlive the pool, whose destructor ends the held batch
  RecordingPool p(/*lend=*/true);
  EXPECT_EQ(p.RunOne(), 0);
  EXPECT_THAT(p.devices[0]->lent(), ElementsAre(4));

  p.pool->Submit([&](AttentionDevice&, int) {  // device 0 (all idle: the first), held
    started.count_down();
    release.wait();
  });
  started.wait();
  EXPECT_EQ(p.RunOne(), 1);
  EXPECT_THAT(p.devices[1]->lent(), ElementsAre(1));  // half of device 2's
  EXPECT_THAT(p.devices[0]->lent(), ElementsAre(4, 4, 1, 4));
  release.count_down();
}

TEST(DevicePoolTest, WithoutLendingNothingIsLent) {
  RecordingPool p(/*lend=*/false);
  p.RunOne();
  EXPECT_THAT(p.devices[0]->lent(), IsEmpty());
}

}  // namespace
}  // namespace mlaserve::engine
