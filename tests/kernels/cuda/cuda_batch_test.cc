// The CUDA half held to the same golden as the fake GPU (tests/kernels/gpu/): every standard
// and FP8 batch, the served model's own shapes, and a fault that takes the device out. Each
// test skips with a message where no GPU is present; with MLASERVE_REQUIRE_GPU=1 a missing
// GPU fails it instead.

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/mla/batch_step_builder.h"
#include "tests/testing/decode_batch_scenario.h"
#include "tests/testing/gpu_batch_checks.h"

namespace mlaserve::cuda {
namespace {

using mlaserve::testing::NamedScenario;

bool GpuRequired() {
  const char* v = std::getenv("MLASERVE_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto runtime = CudaRuntime::Create(0);
    if (!runtime.ok()) {
      if (GpuRequired()) FAIL() << "MLASERVE_REQUIRE_GPU=1 and no GPU: " << runtime.status();
      GTEST_SKIP() << "no CUDA GPU here (" << runtime.status() << ")";
    }
    runtime_ = *std::move(runtime);
  }
  std::unique_ptr<CudaRuntime> runtime_;
};

class CudaBatchTest : public CudaTest, public ::testing::WithParamInterface<NamedScenario> {};

TEST_P(CudaBatchTest, EveryStandardBatchMatchesTheGolden) {
  mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, GetParam(), std::random_device{}());
  EXPECT_TRUE(runtime_->health().ok()) << runtime_->health();
}

INSTANTIATE_TEST_SUITE_P(Batches, CudaBatchTest,
                         ::testing::ValuesIn(mlaserve::testing::GpuScenarios()),
                         [](const auto& param_info) { return param_info.param.name; });

// A GPU that faults is never trusted again: the fault's status, then every later call fails
// with it, and no answer comes back. (Each test runs in a process of its own: the trap ends
// this process's CUDA context.)
TEST_F(CudaTest, AFaultTakesTheDeviceOutForGood) {
  const NamedScenario scenario = mlaserve::testing::StandardBatchScenarios()[0];
  auto s = mlaserve::testing::BatchScenario::Make(scenario.spec, 5);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok());
  auto inputs = mlaserve::testing::ResidentInputs::Upload(*runtime_, built->steps);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  gpu::GpuBatchExecutor executor(*runtime_);
  ASSERT_TRUE(executor.Run(built->steps, inputs->resolver()).ok());

  const absl::Status trap = runtime_->InjectTrap();
  EXPECT_EQ(trap.code(), absl::StatusCode::kUnavailable) << trap;
  EXPECT_EQ(runtime_->health().code(), absl::StatusCode::kUnavailable);
  auto run = executor.Run(built->steps, inputs->resolver());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable) << run.status();
  EXPECT_THAT(std::string(run.status().message()), ::testing::HasSubstr("out of service"));
  EXPECT_EQ(runtime_->Allocate(1024, "after the fault").status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace mlaserve::cuda
