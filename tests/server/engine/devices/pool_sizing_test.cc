#include "server/engine/devices/pool_sizing.h"

#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_host.h"

namespace mlaserve::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

HostResources Host(int cpus, double quota = 0) { return mlaserve::testing::FakeHost(cpus, quota); }

constexpr std::nullopt_t kAuto = std::nullopt;

PoolRequest Ask(std::optional<int> devices, std::optional<int> host_threads,
                bool host_device = false) {
  return PoolRequest{devices, host_threads, host_device};
}

TEST(SizePoolTest, LeftToItEveryUsableCpuGetsADeviceOfOneThread) {
  PoolSizing p = SizePool({}, Host(16));
  EXPECT_EQ(p.devices, 16);
  EXPECT_EQ(p.host_threads, 1);
  EXPECT_FALSE(p.oversubscribed);
  EXPECT_THAT(p.rule, StartsWith("auto: "));
  EXPECT_THAT(p.rule, HasSubstr("16 CPUs (0-15)"));

  p = SizePool({}, Host(2));
  EXPECT_EQ(p.devices, 2);  // the 2-core machine keeps the pool it had
  EXPECT_EQ(p.host_threads, 1);
}

TEST(SizePoolTest, ACgroupQuotaLimitsThePool) {
  PoolSizing p = SizePool({}, Host(64, 6.5));
  EXPECT_EQ(p.usable_cpus, 6);
  EXPECT_EQ(p.devices, 6);
  EXPECT_THAT(p.rule, HasSubstr("a CPU quota of 6.50"));
  EXPECT_EQ(SizePool({}, Host(8, 0.25)).devices, 1);
}

TEST(SizePoolTest, AFixedSideSharesTheCpusOutOverTheOther) {
  PoolSizing p = SizePool(Ask(4, kAuto), Host(16));
  EXPECT_EQ(p.devices, 4);
  EXPECT_EQ(p.host_threads, 4);
  EXPECT_THAT(p.rule, StartsWith("as given: 4 devices; auto: 4 host threads each"));

  p = SizePool(Ask(kAuto, 2), Host(16));
  EXPECT_EQ(p.devices, 8);
  EXPECT_EQ(p.host_threads, 2);

  p = SizePool(Ask(32, kAuto), Host(16));  // more devices than CPUs: one thread each
  EXPECT_EQ(p.host_threads, 1);
  EXPECT_TRUE(p.oversubscribed);

  p = SizePool(Ask(kAuto, 8), Host(4));
  EXPECT_EQ(p.devices, 1);
  EXPECT_TRUE(p.oversubscribed);
}

TEST(SizePoolTest, BothGivenAreKeptAsGiven) {
  PoolSizing p = SizePool(Ask(3, 5), Host(2));
  EXPECT_EQ(p.devices, 3);
  EXPECT_EQ(p.host_threads, 5);
  EXPECT_TRUE(p.oversubscribed);
  EXPECT_EQ(p.rule, "as given: 3 devices x 5 host threads");
}

TEST(SizePoolTest, TheHostDeviceTakesEveryUsableCpu) {
  PoolSizing p = SizePool(Ask(kAuto, kAuto, true), Host(12, 10));
  EXPECT_EQ(p.devices, 1);
  EXPECT_EQ(p.host_threads, 10);
  p = SizePool(Ask(kAuto, 3, true), Host(12));
  EXPECT_EQ(p.host_threads, 3);
}

// A pool sized from the host shares its CPUs between its devices (a lone busy device runs on
// the idle ones' too); one sized by hand on both sides, one that oversubscribes, a single
// device and the host device do not, nor any with --share_cpus=false.
TEST(SizePoolTest, DevicesSizedFromTheHostShareItsCpus) {
  PoolSizing p = SizePool({}, Host(16));
  EXPECT_EQ(p.shared_cpus, 16);
  EXPECT_THAT(p.rule, HasSubstr("idle devices' CPUs lent to busy ones (16 shared, up to 8 host "
                                "threads a device)"));
  EXPECT_EQ(SizePool({}, Host(2)).shared_cpus, 2);
  EXPECT_EQ(SizePool(Ask(4, kAuto), Host(16)).shared_cpus, 16);
  EXPECT_EQ(SizePool(Ask(kAuto, 2), Host(16)).shared_cpus, 16);
  EXPECT_EQ(SizePool(Ask(4, 4), Host(16)).shared_cpus, 0);       // as given
  EXPECT_EQ(SizePool(Ask(32, kAuto), Host(16)).shared_cpus, 0);  // oversubscribed
  EXPECT_EQ(SizePool({}, Host(1)).shared_cpus, 0);               // one device
  EXPECT_EQ(SizePool(Ask(kAuto, kAuto, true), Host(8)).shared_cpus, 0);
  PoolRequest off;
  off.share_cpus = false;
  p = SizePool(off, Host(16));
  EXPECT_EQ(p.shared_cpus, 0);
  EXPECT_THAT(p.rule, ::testing::Not(HasSubstr("lent")));
}

TEST(SizePoolTest, LentThreadsCoverTheSharedCpusUpToEight) {
  EXPECT_EQ(LentThreads(2, 1), 2);
  EXPECT_EQ(LentThreads(16, 1), 8);
  EXPECT_EQ(LentThreads(16, 12), 12);  // never fewer than the device's own
}

}  // namespace
}  // namespace mlaserve::engine
