// The batch-invariance check (tests/testing/batch_invariance_check.h) on the emulated NPU, split
// over its AIC cores as the engine's NPU device splits: a query's answer in batches of 2 to 256
// is the one it gets alone.

#include <memory>
#include <random>

#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/core/row_matmul.h"
#include "kernels/mla/batch_step_builder.h"
#include "kernels/npu/programs/batch_launch.h"
#include "tests/testing/batch_invariance_check.h"
#include "tests/testing/npu_device.h"

namespace mlaserve::npu {
namespace {

TEST(NpuBatchInvarianceTest, AQueryAnswersInAnyBatchAsItDoesAlone) {
  std::unique_ptr<Device> device = mlaserve::testing::MakeTestDevice(2);
  ASSERT_NE(device, nullptr);
  const mlaserve::testing::BatchRunner run =
      [&device](const DecodeBatch& batch) -> absl::StatusOr<mlaserve::testing::BatchAnswerBytes> {
    DecodeBatch b = batch;
    b.parallel_units = device->profile().cube_cores;
    b.invariant_projection_rows = kRowMatmulRows;
    ASSIGN_OR_RETURN(BuiltBatch built, BuildBatchSteps(b));
    ASSIGN_OR_RETURN(std::unique_ptr<BatchLaunch> launch,
                     BatchLaunch::Create(*device, built.steps, {}, /*backed=*/true));
    RETURN_IF_ERROR(launch->Run(ExecutionMode::kExecute).status());
    return mlaserve::testing::ReadAnswerBytes(built, *launch);
  };
  mlaserve::testing::ExpectBatchInvariant(run, mlaserve::testing::InvarianceScenario(8, true),
                                          std::random_device{}());
}

}  // namespace
}  // namespace mlaserve::npu
