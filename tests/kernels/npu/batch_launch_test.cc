#include "kernels/npu/programs/batch_launch.h"

#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/mla/batch_step_builder.h"
#include "kernels/mla/host_batch_runner.h"
#include "tests/testing/decode_batch_scenario.h"
#include "tests/testing/npu_device.h"

namespace mlaserve::npu {
namespace {

using mlaserve::testing::BatchScenario;

// The devices a batch's steps run on, each held to the host runner on one thread bit for
// bit (ggml's test-backend-ops idea: every step, every device, one reference).
// kNpuFp8Cube is the hypothetical part whose cube multiplies e4m3 (FP8 batches feed it the
// cache's bytes instead of keys widened by the AIVs).
enum class DeviceKind { kHostTwoThreads, kNpuOneThread, kNpuTwoThreads, kNpuFp8Cube };

std::string DeviceName(DeviceKind d) {
  switch (d) {
    case DeviceKind::kHostTwoThreads:
      return "HostTwoThreads";
    case DeviceKind::kNpuOneThread:
      return "NpuOneThread";
    case DeviceKind::kNpuTwoThreads:
      return "NpuTwoThreads";
    case DeviceKind::kNpuFp8Cube:
      return "NpuFp8CubeTwoThreads";
  }
  return "?";
}
void PrintTo(DeviceKind d, std::ostream* os) { *os << DeviceName(d); }

// The bytes of every answer of a run.
std::vector<std::vector<std::byte>> AnswerBytes(const BatchBuffers& buffers,
                                                const BuiltBatch& built) {
  std::vector<std::vector<std::byte>> bytes;
  for (const auto& group : built.answers) {
    for (const AnswerRef& a : group) {
      const std::span<const std::byte> out =
          buffers.Bytes(a.out.buffer)
              .subspan(a.out.offset * ElementBytes(a.out_type),
                       a.out_elements * ElementBytes(a.out_type));
      const std::span<const std::byte> lse =
          buffers.Bytes(a.lse.buffer).subspan(a.lse.offset * 4, a.lse_elements * 4);
      bytes.emplace_back(out.begin(), out.end());
      bytes.back().insert(bytes.back().end(), lse.begin(), lse.end());
    }
  }
  return bytes;
}

class StepsOnDevicesTest
    : public ::testing::TestWithParam<std::tuple<mlaserve::testing::NamedScenario, DeviceKind>> {};

TEST_P(StepsOnDevicesTest, EveryDeviceEqualsTheHostRunnerBitForBit) {
  const auto& [scenario, kind] = GetParam();
  auto s = BatchScenario::Make(scenario.spec, 200);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok()) << built.status();
  HostBatchRunner reference(1);
  auto expected = reference.Run(built->steps);
  ASSERT_TRUE(expected.ok()) << expected.status();

  std::vector<std::vector<std::byte>> actual;
  if (kind == DeviceKind::kHostTwoThreads) {
    HostBatchRunner runner(2);
    auto buffers = runner.Run(built->steps);
    ASSERT_TRUE(buffers.ok()) << buffers.status();
    actual = AnswerBytes(**buffers, *built);
  } else {
    auto device = testing::MakeTestDevice(
        kind == DeviceKind::kNpuOneThread ? 1 : 2,
        kind == DeviceKind::kNpuFp8Cube ? "ascend910-fp8" : "ascend910-die");
    auto launch = BatchLaunch::Create(*device, built->steps, {}, /*backed=*/true);
    ASSERT_TRUE(launch.ok()) << launch.status();
    auto report = (*launch)->Run(ExecutionMode::kExecute);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_GT(report->modeled_us, 0);
    actual = AnswerBytes(**launch, *built);
  }
  const auto want = AnswerBytes(**expected, *built);
  ASSERT_EQ(actual.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(actual[i] == want[i]) << "answer " << i << " differs from the host runner's";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Batches, StepsOnDevicesTest,
    ::testing::Combine(::testing::ValuesIn(mlaserve::testing::StandardBatchScenarios()),
                       ::testing::Values(DeviceKind::kHostTwoThreads, DeviceKind::kNpuOneThread,
                                         DeviceKind::kNpuTwoThreads)),
    [](const auto& param_info) {
      return absl::StrCat(std::get<0>(param_info.param).name, "_",
                          DeviceName(std::get<1>(param_info.param)));
    });

INSTANTIATE_TEST_SUITE_P(
    InvariantBatches, StepsOnDevicesTest,
    ::testing::Combine(::testing::ValuesIn(mlaserve::testing::InvariantBatchScenarios()),
                       ::testing::Values(DeviceKind::kNpuTwoThreads)),
    [](const auto& param_info) {
      return absl::StrCat(std::get<0>(param_info.param).name, "_",
                          DeviceName(std::get<1>(param_info.param)));
    });

INSTANTIATE_TEST_SUITE_P(
    Fp8Batches, StepsOnDevicesTest,
    ::testing::Combine(::testing::ValuesIn(mlaserve::testing::Fp8BatchScenarios()),
                       ::testing::Values(DeviceKind::kHostTwoThreads, DeviceKind::kNpuOneThread,
                                         DeviceKind::kNpuTwoThreads, DeviceKind::kNpuFp8Cube)),
    [](const auto& param_info) {
      return absl::StrCat(std::get<0>(param_info.param).name, "_",
                          DeviceName(std::get<1>(param_info.param)));
    });

// A model-only launch needs no memory: the planner's shapes with null pointers.
TEST(BatchLaunchTest, ModelsABatchWithoutMemoryAndRefusesToExecuteOne) {
  mlaserve::testing::BatchScenarioSpec tree;
  for (const auto& scenario : mlaserve::testing::StandardBatchScenarios()) {
    if (scenario.name == "HybridTreeShared") tree = scenario.spec;
  }
  ASSERT_FALSE(tree.prefixes.empty());
  auto s = BatchScenario::Make(tree, 3);
  DecodeBatch batch = s->batch();
  batch.pool = nullptr;
  for (auto& group : batch.groups) {
    group.kv_b = nullptr;
    for (auto& member : group.members) member.q_nope = member.q_pe = member.q_latent = nullptr;
  }
  for (auto& pass : batch.passes) pass.keys = pass.values = nullptr;
  auto built = BuildBatchSteps(batch);
  ASSERT_TRUE(built.ok()) << built.status();
  auto device = testing::MakeTestDevice(1);
  auto model = BatchLaunch::Create(*device, built->steps, {}, /*backed=*/false);
  ASSERT_TRUE(model.ok()) << model.status();
  auto report = (*model)->Run(ExecutionMode::kModelOnly);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->launches.size(), 5u);  // absorb_q, latent, naive, project_out, prefix_merge
  EXPECT_GT(report->modeled_us, 0);
  EXPECT_EQ((*model)->Run(ExecutionMode::kExecute).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(BatchLaunch::Create(*device, built->steps, {}, /*backed=*/true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The FP8 pipeline's own flags ([prep] ahead of the cube, key slots reused) under every
// preload count, and the bf16-query option of a part without an FP8 rate, bit for bit.
TEST(BatchLaunchTest, Fp8BatchesEqualTheHostForEveryPreloadAndBf16Queries) {
  const auto scenarios = mlaserve::testing::Fp8BatchScenarios();
  for (const auto& scenario : scenarios) {
    if (scenario.name != "SplitNaiveAndLatentMtpFp8" && scenario.name != "MixedBf16AndFp8")
      continue;
    for (const bool quantize_queries : {true, false}) {
      auto s = BatchScenario::Make(scenario.spec, 9);
      DecodeBatch batch = s->batch();
      batch.fp8_quantize_queries = quantize_queries;
      auto built = BuildBatchSteps(batch);
      ASSERT_TRUE(built.ok()) << built.status();
      HostBatchRunner reference(1);
      auto expected = reference.Run(built->steps);
      ASSERT_TRUE(expected.ok()) << expected.status();
      const auto want = AnswerBytes(**expected, *built);
      for (const int preload : {0, 1, 2}) {
        auto device = testing::MakeTestDevice(2);
        auto launch = BatchLaunch::Create(*device, built->steps, {.preload = preload},
                                          /*backed=*/true);
        ASSERT_TRUE(launch.ok()) << launch.status();
        auto report = (*launch)->Run(ExecutionMode::kExecute);
        ASSERT_TRUE(report.ok()) << report.status();
        EXPECT_TRUE(AnswerBytes(**launch, *built) == want)
            << scenario.name << " preload " << preload << " quantised queries " << quantize_queries;
      }
    }
  }
}

// FP8 keys have one kernel, SnapMLA over AMLA; an FP8 cube multiplies e4m3 queries. A batch
// asking for anything else is refused before any launch, with a status that says why (the
// engine then fails the batch, never runs it half).
TEST(BatchLaunchTest, RefusesFp8BatchesItHasNoKernelFor) {
  const auto scenarios = mlaserve::testing::Fp8BatchScenarios();
  auto s = BatchScenario::Make(scenarios[0].spec, 3);
  DecodeBatch base = s->batch();
  base.algorithm = RescaleAlgorithm::kBase;
  auto built = BuildBatchSteps(base);
  ASSERT_TRUE(built.ok()) << built.status();
  auto device = testing::MakeTestDevice(1);
  auto launch = BatchLaunch::Create(*device, built->steps, {}, /*backed=*/true);
  EXPECT_EQ(launch.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(launch.status().message()), ::testing::HasSubstr("Base"));

  DecodeBatch bf16_queries = s->batch();
  bf16_queries.fp8_quantize_queries = false;
  built = BuildBatchSteps(bf16_queries);
  ASSERT_TRUE(built.ok()) << built.status();
  auto fp8_cube = testing::MakeTestDevice(1, "ascend910-fp8");
  launch = BatchLaunch::Create(*fp8_cube, built->steps, {}, /*backed=*/true);
  EXPECT_EQ(launch.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(launch.status().message()), ::testing::HasSubstr("e4m3 queries"));
  // Where the cube has no FP8 rate, bf16 queries are the cheaper and exact choice.
  EXPECT_TRUE(BatchLaunch::Create(*device, built->steps, {}, /*backed=*/true).ok());
}

// Split-KV fills the device: a small batch's latent attention gets faster in modelled time
// when it is split over the die's cores.
TEST(BatchLaunchTest, SplitKvShortensASmallBatchsModelledTime) {
  mlaserve::testing::BatchScenarioSpec spec;
  spec.groups = {{.head_space = false, .sq = 1, .prefix = -1, .own_tokens = {8192, 8192}}};
  auto whole = BatchScenario::Make(spec, 4);
  spec.parallel_units = 24;
  auto split = BatchScenario::Make(spec, 4);
  auto device = testing::MakeTestDevice(1);
  double modeled[2];
  int i = 0;
  for (const BatchScenario* s : {whole.get(), split.get()}) {
    auto built = BuildBatchSteps(s->batch());
    ASSERT_TRUE(built.ok());
    auto launch = BatchLaunch::Create(*device, built->steps, {}, /*backed=*/false);
    ASSERT_TRUE(launch.ok()) << launch.status();
    auto report = (*launch)->Run(ExecutionMode::kModelOnly);
    ASSERT_TRUE(report.ok()) << report.status();
    modeled[i++] = report->modeled_us;
  }
  EXPECT_LT(modeled[1], modeled[0] / 3)
      << "split " << modeled[1] << " us, whole " << modeled[0] << " us";
}

}  // namespace
}  // namespace mlaserve::npu
