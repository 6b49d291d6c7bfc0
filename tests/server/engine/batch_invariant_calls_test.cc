// The batch-invariant mode as a call sees it (DecodeOptions::batch_invariant,
// EngineOptions::batch_invariant), on each kind of device the engine pools: the emulated NPU,
// the host, and a GPU (the fake one here; kernels_cuda_test holds a real one to the same
// check at the kernels' level).
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/gpu/fake_gpu_runtime.h"
#include "server/engine/devices/gpu_attention_device.h"
#include "server/engine/devices/host_attention_device.h"
#include "server/engine/engine_impl.h"
#include "tests/server/engine/engine_scenario.h"
#include "tests/server/engine/engine_test_devices.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::BaseOptions;
using ::mlaserve::engine::testing::DecodeSync;
using ::mlaserve::engine::testing::ExpectMatchesGolden;
using ::mlaserve::engine::testing::FirstBatchHeld;
using ::mlaserve::engine::testing::MakeEngine;
using ::mlaserve::engine::testing::OwnedAnswer;
using ::mlaserve::engine::testing::Scenario;
using ::mlaserve::engine::testing::SetThreshold;

enum class Pool { kNpu, kHost, kFakeGpu };

std::vector<std::unique_ptr<AttentionDevice>> Devices(Pool pool) {
  std::vector<std::unique_ptr<AttentionDevice>> devices;
  switch (pool) {
    case Pool::kNpu: {
      auto npu = testing::OneEmulatedNpu();
      EXPECT_TRUE(npu.ok()) << npu.status();
      if (npu.ok()) devices = *std::move(npu);
      break;
    }
    case Pool::kHost:
      devices.push_back(std::make_unique<HostAttentionDevice>(2));
      break;
    case Pool::kFakeGpu:
      devices.push_back(std::make_unique<GpuAttentionDevice>(
          std::make_shared<gpu::FakeGpuRuntime>(), "fake-gpu"));
      break;
  }
  return devices;
}

std::string PoolName(Pool pool) {
  switch (pool) {
    case Pool::kNpu:
      return "Npu";
    case Pool::kHost:
      return "Host";
    case Pool::kFakeGpu:
      return "FakeGpu";
  }
  return "?";
}

// Answers compared as bits: a widened bf16 or an fp32 value equal as a float is the same bits
// except for zeros' signs, which the memcmp catches too.
bool SameBits(const OwnedAnswer& a, const OwnedAnswer& b) {
  return a.out_type == b.out_type && a.out.size() == b.out.size() && a.lse.size() == b.lse.size() &&
         std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

class BatchInvariantCallsTest : public ::testing::TestWithParam<Pool> {};

// A query on a prefix shared by 16 sequences: alone, and in one call with the 15 others (a
// group far over B_theta, which out of the mode runs the hybrid), in the mode: the same bits,
// absorb-only, no threshold applied; out of it the same call takes the hybrid. Long
// sequences, so that split-KV would cut the lone query differently than the full batch.
TEST_P(BatchInvariantCallsTest, AQueryAnswersInABigBatchAsItDoesAlone) {
  EngineOptions options = BaseOptions();
  SetThreshold(options, 2.0);
  Scenario s(MakeEngine(options, Devices(GetParam())), 31, /*data_scale=*/0.1);
  s.RegisterPrefix("P", "", 1100);
  std::vector<OwnedDecodeQuery> queries;
  for (int i = 0; i < 16; ++i) {
    const std::string id = absl::StrCat("s", i);
    s.CreateSequence(id, "P", 1 + 131 * i);
    queries.push_back(s.HeadQuery(id, 1, 1));
  }
  DecodeOptions invariant;
  invariant.batch_invariant = true;
  auto alone = DecodeSync(s.engine(), {queries[5]}, invariant);
  ASSERT_TRUE(alone.ok()) << alone.status();
  auto together = DecodeSync(s.engine(), queries, invariant);
  ASSERT_TRUE(together.ok()) << together.status();
  const std::vector<int> checked = {0, 5, 15};  // the fp64 golden is the test's slow part
  std::vector<OwnedDecodeQuery> checked_queries;
  std::vector<OwnedAnswer> checked_answers;
  for (int i : checked) {
    checked_queries.push_back(queries[i]);
    checked_answers.push_back((*together)[i]);
  }
  ExpectMatchesGolden(s, checked_queries, checked_answers);
  const OwnedAnswer& mine = (*together)[5];
  EXPECT_TRUE(SameBits(mine, (*alone)[0]));
  EXPECT_EQ(mine.plan.formulation, Formulation::kAbsorb);
  EXPECT_EQ(mine.plan.group_size, 16);
  EXPECT_EQ(mine.plan.b_theta, std::numeric_limits<double>::infinity());

  auto usual = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(usual.ok()) << usual.status();
  EXPECT_EQ((*usual)[5].plan.formulation, Formulation::kHybrid);
  EXPECT_FALSE(SameBits((*usual)[5], (*alone)[0]));
}

// The engine's default (the server's --batch_invariant) holds for calls that do not choose,
// and a call's own choice wins over it either way.
TEST_P(BatchInvariantCallsTest, TheEnginesDefaultHoldsUnlessACallChooses) {
  EngineOptions options = BaseOptions();
  SetThreshold(options, 2.0);
  options.batch_invariant = true;
  Scenario s(MakeEngine(options, Devices(GetParam())), 32, /*data_scale=*/0.1);
  EXPECT_TRUE(s.engine().Info().batch_invariant);
  s.RegisterPrefix("P", "", 300);
  std::vector<OwnedDecodeQuery> queries;
  for (int i = 0; i < 4; ++i) {
    const std::string id = absl::StrCat("s", i);
    s.CreateSequence(id, "P", 5 + i);
    queries.push_back(s.HeadQuery(id, 0, 1));
  }
  auto by_default = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_EQ((*by_default)[0].plan.formulation, Formulation::kAbsorb);
  DecodeOptions opt_out;
  opt_out.batch_invariant = false;
  auto usual = DecodeSync(s.engine(), queries, opt_out);
  ASSERT_TRUE(usual.ok()) << usual.status();
  EXPECT_EQ((*usual)[0].plan.formulation, Formulation::kHybrid);
  ExpectMatchesGolden(s, queries, *usual);
}

INSTANTIATE_TEST_SUITE_P(Pools, BatchInvariantCallsTest,
                         ::testing::Values(Pool::kNpu, Pool::kHost, Pool::kFakeGpu),
                         [](const auto& param_info) { return PoolName(param_info.param); });

// Calls in the mode and out of it are never in one device batch (a batch is planned one way):
// queued behind a held device, they come out as two batches, each of its own kind.
TEST(BatchInvariantBatchingTest, CallsInAndOutOfTheModeAreBatchedApart) {
  FirstBatchHeld held;  // outlives the engine
  EngineOptions options = BaseOptions();
  options.max_wait = absl::Seconds(60);  // nothing is cut until the device frees up
  Scenario s(MakeEngine(options, held.Devices()));
  for (const char* id : {"w", "a", "b", "c", "d"}) s.CreateSequence(id, "", 40);
  const OwnedDecodeQuery qw = s.HeadQuery("w", 0, 1);
  auto fw = std::async(std::launch::async, [&] { return DecodeSync(s.engine(), {qw}); });
  while (s.engine().Stats().batches < 1) std::this_thread::yield();  // w holds the device

  const std::vector<std::optional<bool>> modes = {true, false, true, std::nullopt};
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"a", "b", "c", "d"}) queries.push_back(s.HeadQuery(id, 0, 1));
  std::vector<std::future<absl::StatusOr<std::vector<OwnedAnswer>>>> futures;
  for (size_t i = 0; i < queries.size(); ++i) {
    futures.push_back(std::async(std::launch::async, [&s, &queries, &modes, i] {
      DecodeOptions o;
      o.batch_invariant = modes[i];
      return DecodeSync(s.engine(), {queries[i]}, std::move(o));
    }));
  }
  while (s.engine().Stats().queued < 4) std::this_thread::yield();
  held.Release();
  ASSERT_TRUE(fw.get().ok());
  for (size_t i = 0; i < queries.size(); ++i) {
    auto answers = futures[i].get();
    ASSERT_TRUE(answers.ok()) << answers.status();
    // Two in the mode (a, c); two out of it (b, and d, which takes the engine's default).
    EXPECT_EQ((*answers)[0].plan.batch_size, 2) << "call " << i;
  }
}

}  // namespace
}  // namespace mlaserve::engine
