// The emulated NPU as a pool device: on the same planned batches it must give exactly the
// host device's answers (the contract of AttentionDevice), and report a modelled time.

#include "server/engine/devices/npu_attention_device.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <variant>

#include "gtest/gtest.h"
#include "kernels/npu/device_profile.h"
#include "server/engine/devices/host_attention_device.h"
#include "tests/server/engine/engine_scenario.h"

namespace mlaserve::engine {
namespace {

using testing::DecodeSync;
using testing::Scenario;
using testing::SetThreshold;
using testing::SmallModel;

// Runs every batch on both devices and keeps what they disagree on: every byte of every
// answer buffer.
class TwinDevice final : public AttentionDevice {
 public:
  TwinDevice(std::unique_ptr<AttentionDevice> npu, std::unique_ptr<AttentionDevice> host)
      : npu_(std::move(npu)), host_(std::move(host)) {}
  const DeviceInfo& info() const override { return npu_->info(); }

  absl::StatusOr<DeviceRun> Run(const BatchSteps& steps) override {
    absl::StatusOr<DeviceRun> npu = npu_->Run(steps);
    absl::StatusOr<DeviceRun> host = host_->Run(steps);
    if (!npu.ok()) return npu.status();
    if (!host.ok()) return host.status();
    std::lock_guard lock(mu_);
    ++batches_;
    for (const BatchStep& step : steps.steps) {
      std::visit([&](const auto& s) { step_names_.insert(s.name); }, step);
    }
    modeled_us_.push_back(npu->modeled_us);
    for (int b = 0; b < static_cast<int>(steps.buffers.size()); ++b) {
      if (steps.buffers[b].kind != StepBuffer::Kind::kOutput) continue;
      const auto x = npu->buffers->Bytes(b), y = host->buffers->Bytes(b);
      ++outputs_compared_;
      if (x.size() != y.size() || !std::equal(x.begin(), x.end(), y.begin())) ++mismatches_;
    }
    return npu;
  }

  std::mutex mu_;
  int batches_ = 0;
  int outputs_compared_ = 0;
  int mismatches_ = 0;
  std::set<std::string> step_names_;
  std::vector<double> modeled_us_;

 private:
  std::unique_ptr<AttentionDevice> npu_;
  std::unique_ptr<AttentionDevice> host_;
};

std::unique_ptr<NpuAttentionDevice> MakeNpu() {
  auto profile = npu::LoadDeviceProfile("ascend910-die");
  EXPECT_TRUE(profile.ok()) << profile.status();
  auto device = NpuAttentionDevice::Create(*profile, {.host_threads = 2});
  EXPECT_TRUE(device.ok()) << device.status();
  return std::move(*device);
}

struct Harness {
  TwinDevice* twin = nullptr;
  std::unique_ptr<Scenario> scenario;
};

Harness MakeHarness(ModelConfig model, double b_theta, int max_sq) {
  EngineOptions options;
  options.model = model;
  options.weights.seed = 11;
  options.kv.budget_bytes = int64_t{512} << 20;
  options.kv.page_size = 64;
  options.max_sq = max_sq;
  SetThreshold(options, b_theta);
  auto twin = std::make_unique<TwinDevice>(MakeNpu(), std::make_unique<HostAttentionDevice>());
  Harness h;
  h.twin = twin.get();
  std::vector<std::unique_ptr<AttentionDevice>> devices;
  devices.push_back(std::move(twin));
  auto engine = EngineImpl::Create(std::move(options), std::move(devices));
  EXPECT_TRUE(engine.ok()) << engine.status();
  h.scenario = std::make_unique<Scenario>(std::move(*engine), 5);
  return h;
}

TEST(NpuAttentionDeviceTest, MixedBatchEqualsTheHostDeviceBitForBit) {
  // Two prefix levels (hybrid groups over both), a group below the threshold, sequences
  // without a prefix, latent-space queries, sq up to 2, a suffix shorter than sq.
  Harness h = MakeHarness(SmallModel(), /*b_theta=*/5.0, /*max_sq=*/2);
  Scenario& s = *h.scenario;
  s.RegisterPrefix("P1", "", 300);
  s.RegisterPrefix("P2", "P1", 200);
  s.CreateSequence("a1", "P1", 5);
  s.CreateSequence("a2", "P1", 700);
  s.CreateSequence("a3", "P1", 1);
  s.CreateSequence("b1", "P2", 17);
  s.CreateSequence("b2", "P2", 64);
  s.CreateSequence("b3", "P2", 3);
  s.CreateSequence("c1", "", 40);
  s.CreateSequence("c2", "", 513);
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"a1", "a2", "a3", "b1", "b2", "b3", "c1"})
    queries.push_back(s.HeadQuery(id, 1, 2));
  queries.push_back(s.LatentQuery("c2", 1, 2));
  queries.push_back(s.LatentQuery("a1", 0, 1));
  queries.push_back(s.HeadQuery("b1", 0, 1));
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  EXPECT_EQ((*answers)[0].plan.formulation, Formulation::kHybrid);
  EXPECT_EQ((*answers)[3].plan.formulation, Formulation::kHybrid);
  EXPECT_EQ((*answers)[3].plan.prefix_id, "P2");
  EXPECT_TRUE(h.twin->step_names_.contains("naive") && h.twin->step_names_.contains("latent"));
  EXPECT_GT(h.twin->outputs_compared_, 0);
  EXPECT_EQ(h.twin->mismatches_, 0);
  ASSERT_FALSE(h.twin->modeled_us_.empty());
  EXPECT_GT(h.twin->modeled_us_[0], 0.0);
}

TEST(NpuAttentionDeviceTest, RowGroupsSplitAcrossTaskHeightsEqualTheHost) {
  // 80 heads x sq 4 = 320 rows per member: two row groups (256 + 64) on the device, three
  // matrix tiles (128 + 128 + 64) on the host; the naive part has 3 x 4 = 12 rows per head.
  Harness h = MakeHarness(SmallModel(/*heads=*/80, /*layers=*/1), /*b_theta=*/2.0, /*max_sq=*/4);
  Scenario& s = *h.scenario;
  s.RegisterPrefix("P", "", 130);
  for (const char* id : {"x", "y", "z"}) s.CreateSequence(id, "P", 9);
  s.CreateSequence("w", "", 200);
  std::vector<OwnedDecodeQuery> queries;
  for (const char* id : {"x", "y", "z", "w"}) queries.push_back(s.HeadQuery(id, 0, 4));
  auto answers = DecodeSync(s.engine(), queries);
  ASSERT_TRUE(answers.ok()) << answers.status();
  EXPECT_EQ((*answers)[0].plan.formulation, Formulation::kHybrid);
  EXPECT_GT(h.twin->outputs_compared_, 0);
  EXPECT_EQ(h.twin->mismatches_, 0);
}

TEST(NpuAttentionDeviceTest, ReportsTheProfileAndItsRoofline) {
  auto device = MakeNpu();
  EXPECT_EQ(device->info().profile, "ascend910-die");
  EXPECT_NEAR(device->info().matrix_tflops, 2.0 * 24 * 4096 * 1.8e9 / 1e12, 1e-9);
  EXPECT_NEAR(device->info().hbm_tbps, 889 * 1.8e9 / 1e12, 1e-9);
  EXPECT_EQ(device->info().host_threads, 2);
}

TEST(NpuAttentionDeviceTest, OnlyTheAmlaKernelServes) {
  auto profile = npu::LoadDeviceProfile("ascend910-die");
  ASSERT_TRUE(profile.ok());
  auto device = NpuAttentionDevice::Create(*profile, {}, {.algorithm = RescaleAlgorithm::kBase});
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mlaserve::engine
