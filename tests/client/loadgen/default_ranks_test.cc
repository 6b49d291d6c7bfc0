#include "client/loadgen/default_ranks.h"

#include "gtest/gtest.h"

namespace mlaserve::loadgen {
namespace {

v1::GetServerInfoResponse Pool(int devices, const char* kind) {
  v1::GetServerInfoResponse info;
  for (int d = 0; d < devices; ++d) info.add_devices()->set_kind(kind);
  return info;
}

TEST(DefaultRanksTest, ARankPerCpuDeviceAndEightPerGpuAndNeverFewerThanTwo) {
  EXPECT_EQ(DefaultRanks(Pool(16, "npu")), 16);
  EXPECT_EQ(DefaultRanks(Pool(3, "host")), 3);
  EXPECT_EQ(DefaultRanks(Pool(1, "gpu")), kRanksPerGpu);
  EXPECT_EQ(DefaultRanks(Pool(1, "npu")), kMinRanks);
  EXPECT_EQ(DefaultRanks(Pool(0, "npu")), kMinRanks);
}

}  // namespace
}  // namespace mlaserve::loadgen
