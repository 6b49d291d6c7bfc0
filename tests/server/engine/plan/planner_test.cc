#include "server/engine/plan/planner.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/gpu/gpu_runtime.h"
#include "server/engine/model/model_config.h"

namespace mlaserve::engine {
namespace {

TEST(PlannerTest, ThresholdReproducesTheTyphoonPaperForDeepSeekV3) {
  auto model = PresetModelConfig("deepseek-v3");
  ASSERT_TRUE(model.ok());
  // The paper's Ascend numbers: T = 376 TFLOPS, M = 1.8 TB/s -> B_theta = 61.
  const DeviceRates rates{376e12, 1.8e12};
  EXPECT_EQ(static_cast<int>(TyphoonBatchThreshold(*model, 1, rates)), 61);
  // Written out independently: (192 + 128) / (1 * (2 * 512 + 64)) * 376 / 1.8.
  EXPECT_NEAR(TyphoonBatchThreshold(*model, 1, rates), 320.0 / 1088.0 * 376.0 / 1.8, 1e-9);
  // More query tokens per sequence make absorb costlier per byte read: half the threshold.
  EXPECT_NEAR(TyphoonBatchThreshold(*model, 2, rates), TyphoonBatchThreshold(*model, 1, rates) / 2,
              1e-9);
}

TEST(PlannerTest, ThresholdScalesWithTheDeviceBalanceOnly) {
  auto dsv3 = PresetModelConfig("deepseek-v3");
  auto kimi = PresetModelConfig("kimi-k2");
  ASSERT_TRUE(dsv3.ok() && kimi.ok());
  const DeviceRates die{353.9e12, 1.6e12};  // one Ascend 910 die (ascend910-die profile)
  // Head count cancels out of the balance: Kimi K2 and DeepSeek-V3 share the threshold.
  EXPECT_DOUBLE_EQ(TyphoonBatchThreshold(*dsv3, 1, die), TyphoonBatchThreshold(*kimi, 1, die));
  EXPECT_NEAR(TyphoonBatchThreshold(*dsv3, 1, die), 320.0 / 1088.0 * 353.9 / 1.6, 1e-9);
}

// Where the naive pass's math takes time of its own (rate Tn), the threshold is where the
// prefix's two forms cost the same: B A / T = N / M + B Sq N / Tn, N = 320, A = Sq 1088.
TEST(PlannerTest, ANaiveRateOfItsOwnRaisesTheThresholdOrRulesTheHybridOut) {
  auto model = PresetModelConfig("deepseek-v3");
  ASSERT_TRUE(model.ok());
  const double t = 400e12, m = 3.35e12;
  for (int sq : {1, 2}) {
    const DeviceRates hidden{t, m};
    const DeviceRates slow_naive{t, m, 0, 200e12};
    const double b = TyphoonBatchThreshold(*model, sq, slow_naive);
    const double absorb_time = b * sq * 1088.0 / t;
    const double naive_time = 320.0 / m + b * sq * 320.0 / 200e12;
    EXPECT_NEAR(absorb_time, naive_time, 1e-9 * absorb_time) << "sq " << sq;
    EXPECT_GT(b, TyphoonBatchThreshold(*model, sq, hidden));
    // A naive kernel at 101 of the latent kernel's 400 TFLOP/s never pays: 320 / 101 > 1088 / 400.
    const DeviceRates slower{t, m, 0, 101e12};
    EXPECT_TRUE(std::isinf(TyphoonBatchThreshold(*model, sq, slower))) << "sq " << sq;
    const Planner planner(*model, slower, 2);
    EXPECT_TRUE(std::isinf(planner.BTheta(sq)));
  }
}

// The H200's rates as the CUDA runtime states them (gpu_runtime.h, docs/performance.md 18: the
// seesaw kernel at 412 of 1,070 TFLOP/s, the naive pass on the expanded-heads kernel at 219, HBM
// 4.81 TB/s):
// the threshold falls where `mlaserve-bench typhoon` found the hybrid's break-even, above the
// batch of 32 it lost (0.91x absorb-only) and at most the 64 it won (1.17x); on mma.sync's
// naive pass (101) the hybrid never pays.
TEST(PlannerTest, TheH200sRatesPutTheThresholdAtTheBenchsBreakEven) {
  auto model = PresetModelConfig("deepseek-v3");
  ASSERT_TRUE(model.ok());
  const double peak = 1070e12;
  const DeviceRates h200{peak * gpu::kSeesawAbsorbShare, 4.81e12, 0,
                         peak * gpu::kExpandedNaiveShare};
  const Planner planner(*model, h200, 1);
  EXPECT_GT(planner.BTheta(1), 32);
  EXPECT_LE(planner.BTheta(1), 64);
  const DeviceRates mma_naive{peak * gpu::kSeesawAbsorbShare, 4.81e12, 0,
                              peak * gpu::kMmaNaiveShare};
  EXPECT_TRUE(std::isinf(TyphoonBatchThreshold(*model, 1, mma_naive)));
}

TEST(PlannerTest, AnFp8RateRaisesTheThresholdOfFp8GroupsOnly) {
  auto model = PresetModelConfig("deepseek-v3");
  ASSERT_TRUE(model.ok());
  const DeviceRates no_fp8{376e12, 1.8e12};
  // Without an FP8 rate the absorb form costs what it does in bf16.
  EXPECT_DOUBLE_EQ(TyphoonBatchThreshold(*model, 1, no_fp8, KvDtype::kFp8),
                   TyphoonBatchThreshold(*model, 1, no_fp8));
  // At twice the rate the content work (2 Dl of 2 Dl + Dr) halves: written out,
  // (192 + 128) / (512 + 64) * 376 / 1.8.
  const DeviceRates fp8{376e12, 1.8e12, 752e12};
  EXPECT_NEAR(TyphoonBatchThreshold(*model, 1, fp8, KvDtype::kFp8), 320.0 / 576.0 * 376.0 / 1.8,
              1e-9);
  EXPECT_DOUBLE_EQ(TyphoonBatchThreshold(*model, 1, fp8), TyphoonBatchThreshold(*model, 1, no_fp8));
  const Planner planner(*model, fp8, 2);
  EXPECT_NEAR(planner.BTheta(2, KvDtype::kFp8), planner.BTheta(1, KvDtype::kFp8) / 2, 1e-9);
  EXPECT_GT(planner.BTheta(1, KvDtype::kFp8), planner.BTheta(1));
}

}  // namespace
}  // namespace mlaserve::engine
