// The GPU device inside the engine, on the fake GPU (host memory, host kernels): the KV cache,
// the weights and the expansions in the device's memory, what crosses the bus per batch, and
// a fault that takes the device out. The CUDA runtime runs the same device on a real GPU
// (tests/kernels/cuda/, and the service tests there).

#include "server/engine/devices/gpu_attention_device.h"

#include <memory>
#include <mutex>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/gpu/fake_gpu_runtime.h"
#include "kernels/mla/fp8_accuracy.h"
#include "server/engine/engine_impl.h"
#include "tests/server/engine/engine_scenario.h"
#include "tests/testing/attention_checks.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::DecodeSync;
using ::mlaserve::engine::testing::ExpectMatchesGolden;
using ::mlaserve::engine::testing::kLseTolerance;
using ::mlaserve::engine::testing::kOutTolerance;
using ::mlaserve::engine::testing::OwnedAnswer;
using ::mlaserve::engine::testing::Scenario;
using ::mlaserve::engine::testing::SetThreshold;
using ::mlaserve::engine::testing::SmallModel;
using ::testing::HasSubstr;

constexpr int64_t kRowBytes = 576 * 2;

// An engine whose pool is one GPU device over a fake GPU the test keeps hold of, and the
// engine's per-batch reports.
struct GpuEngine {
  std::shared_ptr<gpu::FakeGpuRuntime> runtime = std::make_shared<gpu::FakeGpuRuntime>();
  std::mutex mu;
  std::vector<BatchReport> batches;

  std::unique_ptr<EngineImpl> Make(EngineOptions options) {
    options.on_batch = [this](const BatchReport& r) {
      std::lock_guard lock(mu);
      batches.push_back(r);
    };
    std::vector<std::unique_ptr<AttentionDevice>> devices;
    devices.push_back(std::make_unique<GpuAttentionDevice>(runtime, "fake-gpu"));
    auto engine = EngineImpl::Create(std::move(options), std::move(devices));
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }
  BatchReport Last() {
    std::lock_guard lock(mu);
    return batches.back();
  }
};

EngineOptions Options() {
  EngineOptions o;
  o.model = SmallModel();
  o.weights.seed = 7;
  o.kv.budget_bytes = int64_t{64} << 20;
  o.kv.page_size = 16;
  o.max_wait = absl::Microseconds(200);
  o.max_sq = 2;
  return o;
}

// Hybrid groups over a prefix chain, absorb-only ones, both spaces, MTP: against the golden,
// with the naive pass's expansion built by the device in its own memory.
TEST(GpuDeviceTest, AMixedBatchMatchesTheGoldenWithExpansionsOnTheDevice) {
  GpuEngine gpu;
  EngineOptions options = Options();
  SetThreshold(options, 5.0);
  Scenario s(gpu.Make(options));
  s.RegisterPrefix("P1", "", 300);
  s.RegisterPrefix("P2", "P1", 200);
  s.CreateSequence("a1", "P1", 5);
  s.CreateSequence("a2", "P1", 130);
  s.CreateSequence("a3", "P1", 2);
  s.CreateSequence("b1", "P2", 17);
  s.CreateSequence("c1", "", 40);
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"a1", "a2", "a3", "b1", "c1"}) queries.push_back(s.HeadQuery(id, 1, 2));
  queries.push_back(s.LatentQuery("a1", 0, 2));
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ExpectMatchesGolden(s, queries, *answers);
  EXPECT_EQ((*answers)[0].plan.formulation, Formulation::kHybrid);
  EXPECT_EQ(s.engine().Stats().kv.expanded_entries, 1);
  const EngineStats stats = s.engine().Stats();
  ASSERT_EQ(stats.device_memory.size(), 1u);
  const DeviceMemory& m = stats.device_memory.front().second;
  EXPECT_EQ(m.expansion_bytes, stats.kv.expanded_bytes);
  EXPECT_EQ(m.kv_pool_bytes, stats.kv.pages_total * stats.kv.page_bytes);
  EXPECT_GT(m.weights_bytes, 0);
  EXPECT_GT(m.batch_bytes, 0);
}

// FP8 sequences (an FP8 prefix in hybrid, an FP8 sequence of its own) beside bf16 ones.
TEST(GpuDeviceTest, Fp8SequencesBesideBf16OnesMeetTheirBounds) {
  GpuEngine gpu;
  EngineOptions options = Options();
  SetThreshold(options, 2.0);
  Scenario s(gpu.Make(options), 11, /*data_scale=*/0.1);
  s.RegisterPrefix("F", "", 300, KvDtype::kFp8);
  s.CreateSequence("f1", "F", 5);
  s.CreateSequence("f2", "F", 260);
  s.CreateSequence("g", "", 700, KvDtype::kFp8);
  s.CreateSequence("b", "", 90);
  std::vector<OwnedDecodeQuery> queries = {s.HeadQuery("f1", 1, 1), s.HeadQuery("f2", 1, 1),
                                           s.HeadQuery("g", 0, 2), s.LatentQuery("g", 1, 1),
                                           s.HeadQuery("b", 1, 1)};
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  for (size_t i = 0; i < queries.size(); ++i) {
    const GoldenOutput golden = s.Golden(queries[i]);
    if (queries[i].sequence_id == "b") {
      EXPECT_TRUE(mlaserve::testing::AllClose((*answers)[i].out, golden.out, kOutTolerance, true));
      continue;
    }
    const AttentionErrors e = CompareWithGolden((*answers)[i].out, (*answers)[i].lse, golden);
    EXPECT_LE(e.rel_l2, 5e-2) << queries[i].sequence_id;
    EXPECT_LE(e.cos_dist, 1e-3) << queries[i].sequence_id;
  }
  EXPECT_EQ((*answers)[0].plan.formulation, Formulation::kHybrid);
}

// What a batch sends the device: its queries, the rows appended since the last batch (here a
// query's own appended row), and job records; never a sequence's KV, however long.
TEST(GpuDeviceTest, ABatchSendsTheDeviceOnlyItsQueriesAndAppendedRows) {
  GpuEngine gpu;
  Scenario s(gpu.Make(Options()));
  s.CreateSequence("long", "", 2000);
  s.CreateSequence("short", "", 3);

  // The first batch brings every row written so far (both sequences' appends, both layers).
  auto first = DecodeSync(s.engine(), {s.HeadQuery("long", 0, 1)});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(gpu.Last().kv_bytes_to_device, 2 * (2000 + 3) * kRowBytes);

  // A step of the long sequence: its new row, nothing else of its 2000.
  OwnedDecodeQuery step = s.HeadQuery("long", 1, 1);
  s.AttachAppend(step, 1);
  auto answers = DecodeSync(s.engine(), {step});
  ASSERT_TRUE(answers.ok()) << answers.status();
  ExpectMatchesGolden(s, {step}, *answers);
  const BatchReport report = gpu.Last();
  EXPECT_EQ(report.kv_bytes_to_device, kRowBytes);
  const int64_t query_bytes = 8 * (128 + 64) * 2;  // q_nope and q_pe of 8 heads
  EXPECT_GE(report.bytes_to_device, report.kv_bytes_to_device + query_bytes);
  EXPECT_LT(report.bytes_to_device, report.kv_bytes_to_device + query_bytes + 8192)
      << "records should take a few KiB";

  // Nothing written: nothing but the query and records.
  auto again = DecodeSync(s.engine(), {s.HeadQuery("long", 1, 1), s.HeadQuery("short", 1, 1)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(gpu.Last().kv_bytes_to_device, 0);
}

// A GPU fault fails the batch in flight with UNAVAILABLE naming it; the engine reports the
// device unhealthy, and every later call fails at once without reaching the device.
TEST(GpuDeviceTest, AFaultFailsTheBatchAndEveryLaterCall) {
  GpuEngine gpu;
  Scenario s(gpu.Make(Options()));
  s.CreateSequence("a", "", 50);
  ASSERT_TRUE(DecodeSync(s.engine(), {s.HeadQuery("a", 0, 1)}).ok());
  EXPECT_TRUE(s.engine().Health().ok());

  gpu.runtime->InjectFault("Xid 79: GPU has fallen off the bus");
  auto failed = DecodeSync(s.engine(), {s.HeadQuery("a", 0, 1)});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("Xid 79"));
  EXPECT_EQ(s.engine().Health().code(), absl::StatusCode::kUnavailable);

  const int64_t runs = gpu.runtime->programs_run();
  auto later = DecodeSync(s.engine(), {s.HeadQuery("a", 1, 1)});
  EXPECT_EQ(later.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(gpu.runtime->programs_run(), runs);
}

// An expansion the store lets go (its prefix released and freed) gives its device memory
// back before the device's next program.
TEST(GpuDeviceTest, AFreedExpansionGivesItsDeviceMemoryBack) {
  GpuEngine gpu;
  EngineOptions options = Options();
  SetThreshold(options, 1.0);
  Scenario s(gpu.Make(options));
  s.RegisterPrefix("P", "", 300);
  s.CreateSequence("a", "P", 5);
  s.CreateSequence("b", "P", 9);
  s.CreateSequence("other", "", 20);
  auto answers = DecodeSync(s.engine(), {s.HeadQuery("a", 1, 1), s.HeadQuery("b", 1, 1)});
  ASSERT_TRUE(answers.ok()) << answers.status();
  ASSERT_EQ((*answers)[0].plan.formulation, Formulation::kHybrid);
  const int64_t expansion = s.engine().Stats().device_memory.front().second.expansion_bytes;
  EXPECT_EQ(expansion, 8 * 300 * (192 + 128) * 2);
  const int64_t held = gpu.runtime->allocated_bytes();

  ASSERT_TRUE(s.engine().ReleaseSequence("a").ok());
  ASSERT_TRUE(s.engine().ReleaseSequence("b").ok());
  ASSERT_TRUE(s.engine().ReleasePrefix("P").ok());
  EXPECT_EQ(s.engine().Stats().kv.expanded_bytes, 0);
  ASSERT_TRUE(DecodeSync(s.engine(), {s.HeadQuery("other", 1, 1)}).ok());
  EXPECT_EQ(s.engine().Stats().device_memory.front().second.expansion_bytes, 0);
  EXPECT_LE(gpu.runtime->allocated_bytes(), held - expansion);
}

// With no budget named, the KV cache takes the share of the device's free memory that the
// device allows; a device with no room left refuses to start.
TEST(GpuDeviceTest, TheBudgetDefaultsToTheDevicesFreeMemory) {
  GpuEngine big;
  big.runtime = std::make_shared<gpu::FakeGpuRuntime>(
      gpu::FakeGpuRuntime::Options{.memory_bytes = int64_t{3} << 30});
  EngineOptions options = Options();
  options.kv.budget_bytes = 0;
  auto engine = big.Make(options);
  ASSERT_NE(engine, nullptr);
  const int64_t left = (int64_t{3} << 30) -
                       engine->Stats().device_memory.front().second.weights_bytes -
                       GpuAttentionDevice::kReservedBytes;
  EXPECT_EQ(engine->Info().kv_budget_bytes,
            static_cast<int64_t>(static_cast<double>(left) * GpuAttentionDevice::kPoolShare));

  std::vector<std::unique_ptr<AttentionDevice>> devices;
  devices.push_back(std::make_unique<GpuAttentionDevice>(
      std::make_shared<gpu::FakeGpuRuntime>(), "fake-gpu"));  // 1 GiB: less than the reserve
  auto refused = EngineImpl::Create(options, std::move(devices));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no device memory left"));
}

}  // namespace
}  // namespace mlaserve::engine
