#include "server/engine/devices/gpu_attention_device.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/gpu/open_gpu.h"
#include "server/engine/kv/kv_store.h"
#include "spdlog/spdlog.h"

namespace mlaserve::engine {

GpuAttentionDevice::GpuAttentionDevice(std::shared_ptr<gpu::GpuRuntime> runtime, std::string name)
    : runtime_(std::move(runtime)),
      writes_(std::make_shared<PageWriteLog>()),
      residency_(std::make_shared<GpuResidency>(runtime_, writes_)),
      executor_(*runtime_) {
  const gpu::DeviceProperties& p = runtime_->properties();
  info_.profile = std::move(name);
  info_.kind = "gpu";
  info_.description = gpu::DescribeGpu(p);
  info_.host_threads = 0;
  // One attention tile a thread block, one block an SM at a time.
  info_.parallel_units = p.sm_count;
  info_.unit_rows = gpu::kAttentionTileRows;
  info_.dense_unit_rows = p.dense_unit_rows;
  info_.split_block_tokens = gpu::kAttentionBlockKeys;
  info_.balance_waves = true;
  info_.split_part_overhead_blocks = gpu::kAttentionPartOverheadBlocks;
  info_.matrix_tflops = p.bf16_tflops;
  info_.hbm_tbps = p.hbm_tbps;
  info_.absorb_matrix_tflops = p.absorb_tflops;
  info_.naive_matrix_tflops = p.naive_tflops;
  info_.memory_bytes = p.total_memory;
}

absl::StatusOr<KvResidency> GpuAttentionDevice::PlanKvResidency(int64_t weights_bytes) {
  ASSIGN_OR_RETURN(const gpu::MemoryInfo memory, runtime_->Memory());
  const int64_t left = memory.free - weights_bytes - kReservedBytes;
  return KvResidency{writes_, residency_,
                     left > 0 ? static_cast<int64_t>(static_cast<double>(left) * kPoolShare) : 0};
}

absl::Status GpuAttentionDevice::Attach(const ModelWeights& weights, const KvStore& store) {
  RETURN_IF_ERROR(residency_->Attach(weights, store.PoolView()));
  ASSIGN_OR_RETURN(const gpu::MemoryInfo memory, runtime_->Memory());
  free_bytes_ = memory.free;
  return absl::OkStatus();
}

absl::StatusOr<DeviceRun> GpuAttentionDevice::Run(const BatchSteps& steps) {
  RETURN_IF_ERROR(runtime_->health());
  residency_->FreeReleased();
  const std::vector<gpu::UploadCopy> copies = residency_->TakeWrittenRows();
  absl::StatusOr<gpu::GpuBatchExecutor::Result> result = executor_.Run(
      steps, [this](const StepBuffer& b) { return residency_->Resolve(b); }, copies);
  if (!result.ok()) {
    // Rows that may not have arrived go again with the next batch (copying twice is harmless).
    residency_->Unflush(copies);
    return result.status();
  }
  // The driver's free-memory query costs tens of microseconds: once a second is enough for
  // /metrics, and whenever the arena grew.
  const auto now = std::chrono::steady_clock::now();
  if (executor_.arena_bytes() != arena_bytes_.load() ||
      now - memory_read_ > std::chrono::seconds(1)) {
    if (absl::StatusOr<gpu::MemoryInfo> memory = runtime_->Memory(); memory.ok()) {
      free_bytes_ = memory->free;
    }
    memory_read_ = now;
  }
  arena_bytes_ = executor_.arena_bytes();
  DeviceRun run;
  run.buffers = std::move(result->buffers);
  run.device_us = result->timing.kernels_ms * 1e3;
  run.bytes_to_device = result->upload_bytes;
  run.kv_bytes_to_device = result->copied_bytes;
  run.query_bytes_in_place = result->in_place_bytes;
  return run;
}

std::shared_ptr<void> GpuAttentionDevice::MapHostMemory(const void* data, int64_t bytes) {
  absl::StatusOr<std::shared_ptr<void>> mapping = runtime_->MapHost(data, bytes);
  if (!mapping.ok()) {
    spdlog::warn("{}: queries in a {}-byte region are copied, not read in place: {}", info_.profile,
                 bytes, mapping.status().ToString());
    return nullptr;
  }
  return *std::move(mapping);
}

std::optional<DeviceMemory> GpuAttentionDevice::memory() const {
  const GpuResidency::Usage u = residency_->usage();
  DeviceMemory m;
  m.total_bytes = runtime_->properties().total_memory;
  m.free_bytes = free_bytes_.load();
  m.weights_bytes = u.weights_bytes;
  m.kv_pool_bytes = u.pool_bytes;
  m.expansion_bytes = u.expansion_bytes;
  m.batch_bytes = arena_bytes_.load();
  return m;
}

}  // namespace mlaserve::engine
