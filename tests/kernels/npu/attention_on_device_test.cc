#include <bit>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/mla/amla.h"
#include "kernels/mla/flash_base.h"
#include "kernels/npu/device.h"
#include "kernels/npu/programs/latent_decode_on_device.h"
#include "kernels/reference/golden_attention.h"
#include "tests/testing/attention_checks.h"
#include "tests/testing/npu_device.h"
#include "tests/testing/random_batch.h"

namespace mlaserve::npu {
namespace {

// Counts elements whose bits differ and the largest difference in bf16 ulps after the
// output cast.
struct BitwiseDiff {
  int64_t differing_bits = 0;
  int max_bf16_ulps = 0;
  int64_t first = -1;
};

BitwiseDiff Compare(const std::vector<float>& a, const std::vector<float>& b) {
  BitwiseDiff d;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      if (d.first < 0) d.first = static_cast<int64_t>(i);
      ++d.differing_bits;
    }
    const int ua = Bf16::FromFloat(a[i]).bits, ub = Bf16::FromFloat(b[i]).bits;
    d.max_bf16_ulps = std::max(d.max_bf16_ulps, std::abs(ua - ub));
  }
  return d;
}

struct DeviceBatchShape {
  int heads;
  int sq;
  int page_size;
};

class AmlaOnDeviceTest : public ::testing::TestWithParam<DeviceBatchShape> {};

// Each rescale algorithm on the device against its host kernel, on the same kind of batch.
void ExpectDeviceEqualsHost(
    const DeviceBatchShape& c, RescaleAlgorithm algorithm, uint64_t seed,
    absl::StatusOr<AttentionOutput> (*host_kernel)(const LatentDecodeProblem&)) {
  Rng rng(seed + c.heads + c.sq * 7 + c.page_size);
  const auto batch =
      testing::MakeRandomPagedBatch({.sq = c.sq,
                                     .heads = c.heads,
                                     .dk = 576,
                                     .page_size = c.page_size,
                                     .seqlens = {0, 1, c.page_size + 1, 511, 513, 1300}},
                                    rng);
  const LatentDecodeProblem problem = batch.Latent(512, 1.0f / std::sqrt(576.0f));
  auto device = testing::MakeTestDevice();
  auto on_device = RunLatentDecodeOnDevice(*device, problem, {.algorithm = algorithm});
  auto host = host_kernel(problem);
  ASSERT_TRUE(on_device.ok()) << on_device.status();
  ASSERT_TRUE(host.ok()) << host.status();
  const BitwiseDiff out = Compare(on_device->output.out, host->out);
  const BitwiseDiff lse = Compare(on_device->output.lse, host->lse);
  EXPECT_EQ(out.differing_bits, 0)
      << "max bf16 ulps " << out.max_bf16_ulps << ", first at " << out.first;
  EXPECT_EQ(lse.differing_bits, 0);
  EXPECT_GT(on_device->report.modeled_us, 0.0);
  ASSERT_TRUE(on_device->report.host_ms.has_value());
  // The emulator's own phases are timed too.
  EXPECT_GT(on_device->report.host_record_ms, 0.0);
  EXPECT_GT(on_device->report.host_model_ms, 0.0);
}

TEST_P(AmlaOnDeviceTest, EqualsHostAmlaBitForBit) {
  ExpectDeviceEqualsHost(GetParam(), RescaleAlgorithm::kAmla, 500,
                         [](const LatentDecodeProblem& p) { return AmlaDecode(p); });
}

TEST_P(AmlaOnDeviceTest, BaseOnDeviceEqualsHostBaseBitForBit) {
  ExpectDeviceEqualsHost(GetParam(), RescaleAlgorithm::kBase, 600,
                         [](const LatentDecodeProblem& p) { return FlashBaseDecode(p); });
}

// A device keeps released host memory for the next batch's buffers, so a second batch of
// the same shape runs on workspaces and outputs still holding the first one's bytes. Its
// answer must not depend on them.
TEST(AmlaOnDeviceReuseTest, BatchesOnRecycledMemoryEqualTheHostBitForBit) {
  auto device = testing::MakeTestDevice();
  for (uint64_t seed : {11, 12, 13}) {
    Rng rng(seed);
    const auto batch = testing::MakeRandomPagedBatch(
        {.sq = 2, .heads = 64, .dk = 576, .page_size = 64, .seqlens = {300, 1, 700, 129}}, rng);
    const LatentDecodeProblem problem = batch.Latent(512, 1.0f / std::sqrt(576.0f));
    auto on_device =
        RunLatentDecodeOnDevice(*device, problem, {.algorithm = RescaleAlgorithm::kAmla});
    auto host = AmlaDecode(problem);
    ASSERT_TRUE(on_device.ok()) << on_device.status();
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(Compare(on_device->output.out, host->out).differing_bits, 0) << seed;
    EXPECT_EQ(Compare(on_device->output.lse, host->lse).differing_bits, 0) << seed;
    // The batch's buffers went back to the device's spares for the next one.
    EXPECT_GT(device->gm().spare_host_bytes(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AmlaOnDeviceTest,
                         ::testing::Values(DeviceBatchShape{1, 1, 64}, DeviceBatchShape{16, 2, 128},
                                           DeviceBatchShape{128, 1, 128},
                                           DeviceBatchShape{128, 2, 64},
                                           DeviceBatchShape{64, 4, 128}),
                         [](const ::testing::TestParamInfo<DeviceBatchShape>& param_info) {
                           return absl::StrCat("h", param_info.param.heads, "_sq",
                                               param_info.param.sq, "_page",
                                               param_info.param.page_size);
                         });

}  // namespace
}  // namespace mlaserve::npu
