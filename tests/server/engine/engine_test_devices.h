#ifndef MLASERVE_TESTS_SERVER_ENGINE_ENGINE_TEST_DEVICES_H_
#define MLASERVE_TESTS_SERVER_ENGINE_ENGINE_TEST_DEVICES_H_

#include <atomic>
#include <latch>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/devices/host_attention_device.h"
#include "server/engine/devices/npu_attention_device.h"
#include "server/engine/engine_impl.h"
#include "tests/server/engine/engine_scenario.h"

namespace mlaserve::engine::testing {

// The engine tests' options and devices (engine_test.cc: answers against the golden;
// engine_calls_test.cc: what a call sees).

inline EngineOptions BaseOptions() {
  EngineOptions o;
  o.model = SmallModel();
  o.weights.seed = 7;
  o.kv.budget_bytes = int64_t{256} << 20;
  o.kv.page_size = 16;
  o.max_wait = absl::Microseconds(200);
  return o;
}

// A device whose runs a test scripts: it blocks until released, fails, or delegates to the host.
class ScriptedDevice : public AttentionDevice {
 public:
  MOCK_METHOD(absl::StatusOr<DeviceRun>, Run, (const BatchSteps&), (override));
  const DeviceInfo& info() const override { return info_; }
  DeviceInfo info_{"scripted", 1, 1, 0, 0};
};

// The engine's default device, one emulated Ascend 910 die, with two host threads.
inline absl::StatusOr<std::vector<std::unique_ptr<AttentionDevice>>> OneEmulatedNpu() {
  ASSIGN_OR_RETURN(const npu::DeviceProfile profile, npu::LoadDeviceProfile("ascend910-die"));
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionDevice> device,
                   NpuAttentionDevice::Create(profile, {.host_threads = 2}));
  std::vector<std::unique_ptr<AttentionDevice>> devices;
  devices.push_back(std::move(device));
  return devices;
}

// One device that holds its first batch until Release() and runs every batch on the host:
// calls made meanwhile queue behind it. Must outlive the engine given Devices().
class FirstBatchHeld {
 public:
  std::vector<std::unique_ptr<AttentionDevice>> Devices() {
    auto device = std::make_unique<::testing::NiceMock<ScriptedDevice>>();
    ON_CALL(*device, Run).WillByDefault([this](const BatchSteps& steps) {
      if (runs_.fetch_add(1) == 0) release_.wait();
      return host_.Run(steps);
    });
    std::vector<std::unique_ptr<AttentionDevice>> devices;
    devices.push_back(std::move(device));
    return devices;
  }
  void Release() { release_.count_down(); }

 private:
  std::latch release_{1};
  std::atomic<int> runs_{0};
  HostAttentionDevice host_;
};

inline std::unique_ptr<EngineImpl> MakeEngine(
    EngineOptions options, std::vector<std::unique_ptr<AttentionDevice>> devices = {}) {
  if (devices.empty()) devices.push_back(std::make_unique<HostAttentionDevice>());
  auto engine = EngineImpl::Create(std::move(options), std::move(devices));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

}  // namespace mlaserve::engine::testing

#endif  // MLASERVE_TESTS_SERVER_ENGINE_ENGINE_TEST_DEVICES_H_
