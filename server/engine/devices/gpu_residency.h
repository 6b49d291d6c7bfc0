#ifndef MLASERVE_SERVER_ENGINE_DEVICES_GPU_RESIDENCY_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_GPU_RESIDENCY_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/paged_kv_cache.h"
#include "kernels/gpu/gpu_lowering.h"
#include "kernels/gpu/gpu_runtime.h"
#include "kernels/mla/batch_steps.h"
#include "server/engine/kv/expansion_builder.h"
#include "server/engine/kv/page_write_log.h"
#include "server/engine/model/model_weights.h"

namespace mlaserve::engine {

// What a GPU keeps of the engine's state in its own memory across batches (docs/gpu.md,
// "Memory"):
//   weights     every layer's kv_b_proj, uploaded once at start;
//   page pool   a copy of the KV store's pool, page for page at the same offsets, allocated
//               whole at start; rows reach it as they are written (PageWriteLog): a batch
//               uploads the rows written since the last one, never a sequence's KV;
//   expansions  TyphoonMLA's naive-form K/V, computed on the GPU from its pool copy with its
//               weights (ExpansionBuilder), held until the store lets them go.
// The host keeps the pool too: snapshots, restarts, migration and retries read it there.
//
// Threads: everything but the expansions' release runs on the device's thread (batches and
// the expansions the planner asks for while preparing them); a released expansion's memory
// is queued and freed by that thread before its next program.
class GpuResidency final : public ExpansionBuilder {
 public:
  GpuResidency(std::shared_ptr<gpu::GpuRuntime> runtime, std::shared_ptr<PageWriteLog> writes);
  ~GpuResidency() override;
  GpuResidency(const GpuResidency&) = delete;
  GpuResidency& operator=(const GpuResidency&) = delete;

  // Uploads the weights and allocates the pool's copy (RESOURCE_EXHAUSTED when they do not
  // fit). Once, before the first batch.
  absl::Status Attach(const ModelWeights& weights, const PagedKvCache& pool);

  // The rows written since the last call, as copies from the host's pool into the device's.
  // Put them back (Unflush) if they never reached the device.
  std::vector<gpu::UploadCopy> TakeWrittenRows();
  void Unflush(const std::vector<gpu::UploadCopy>& copies);
  // Runs the rows written since the last batch to the device now (an expansion reads them).
  absl::Status Flush();

  // Where a batch's input buffer is on the device: the pool's copy, the weights' copy or an
  // expansion. NOT_FOUND for memory the device does not hold.
  absl::StatusOr<gpu::DevicePtr> Resolve(const StepBuffer& buffer) const;

  // Frees the memory of expansions the store has let go.
  void FreeReleased();

  absl::StatusOr<std::unique_ptr<ExpandedKvData>> Build(const PagePool& pool,
                                                        const Request& request,
                                                        const ModelWeights& weights) override;

  struct Usage {
    int64_t weights_bytes = 0;
    int64_t pool_bytes = 0;
    int64_t expansion_bytes = 0;
  };
  Usage usage() const;

 private:
  // Memory of released expansions, freed by the device's thread.
  struct ReleaseQueue {
    std::mutex mu;
    std::vector<gpu::DevicePtr> pointers;  // guarded by mu
  };
  // [host, host + bytes) mirrored at `device`.
  struct Mirror {
    const std::byte* host = nullptr;
    int64_t bytes = 0;
    gpu::DevicePtr device = 0;
    bool Holds(const void* p, int64_t n) const {
      const auto* b = static_cast<const std::byte*>(p);
      return host != nullptr && b >= host && n >= 0 && b + n <= host + bytes;
    }
    gpu::DevicePtr At(const void* p) const {
      return device + static_cast<gpu::DevicePtr>(static_cast<const std::byte*>(p) - host);
    }
  };

  std::shared_ptr<gpu::GpuRuntime> runtime_;
  std::shared_ptr<PageWriteLog> writes_;
  std::shared_ptr<ReleaseQueue> released_ = std::make_shared<ReleaseQueue>();
  Mirror weights_;
  Mirror pool_;
  int64_t page_bytes_ = 0;
  std::map<gpu::DevicePtr, int64_t> expansions_;  // live expansion allocations: bytes
  std::atomic<int64_t> expansion_bytes_{0};
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_GPU_RESIDENCY_H_
