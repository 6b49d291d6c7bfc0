#ifndef MLASERVE_SERVER_ENGINE_DEVICES_GPU_ATTENTION_DEVICE_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_GPU_ATTENTION_DEVICE_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/gpu/gpu_runtime.h"
#include "server/engine/devices/attention_device.h"
#include "server/engine/devices/gpu_residency.h"

namespace mlaserve::engine {

// A GPU as a pool device (docs/gpu.md): the weights, the KV pool and TyphoonMLA's expansions
// live in its memory (GpuResidency); a batch's steps are lowered into one program
// (kernels/gpu/gpu_lowering.h) whose upload carries the queries and the rows written since the
// last batch, and whose download brings back the answers. Plain C++ over a GpuRuntime: the
// CUDA one on a GPU, the fake one (host kernels) in tests.
//
// Answers equal the host's within floating-point tolerance (FlashMLA's), not bit for bit.
// A fault makes the device unhealthy for good: health() says why and every later batch fails
// UNAVAILABLE with it.
class GpuAttentionDevice final : public AttentionDevice {
 public:
  // `name` is what the server calls it ("cuda:0").
  GpuAttentionDevice(std::shared_ptr<gpu::GpuRuntime> runtime, std::string name);

  const DeviceInfo& info() const override { return info_; }
  absl::StatusOr<DeviceRun> Run(const BatchSteps& steps) override;
  absl::Status health() const override { return runtime_->health(); }
  absl::StatusOr<KvResidency> PlanKvResidency(int64_t weights_bytes) override;
  absl::Status Attach(const ModelWeights& weights, const KvStore& store) override;
  std::optional<DeviceMemory> memory() const override;
  // The runtime's mapping (GpuRuntime::MapHost); null where it refuses (logged).
  std::shared_ptr<void> MapHostMemory(const void* data, int64_t bytes) override;

  // The share of the GPU's free memory the KV budget defaults to, after the weights and
  // kReservedBytes: the rest is left to expansions, which the pool's budget counts but whose
  // device memory is allocated as they are built.
  static constexpr double kPoolShare = 0.75;
  static constexpr int64_t kReservedBytes = int64_t{2} << 30;

 private:
  std::shared_ptr<gpu::GpuRuntime> runtime_;
  std::shared_ptr<PageWriteLog> writes_;
  std::shared_ptr<GpuResidency> residency_;
  gpu::GpuBatchExecutor executor_;
  DeviceInfo info_;
  std::atomic<int64_t> free_bytes_{0};   // the device's free memory after the last batch
  std::atomic<int64_t> arena_bytes_{0};  // the batch arena's size after the last batch
  std::chrono::steady_clock::time_point memory_read_;  // the device thread's
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_GPU_ATTENTION_DEVICE_H_
