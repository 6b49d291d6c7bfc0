#ifndef MLASERVE_SERVER_ENGINE_DEVICES_ATTENTION_DEVICE_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_ATTENTION_DEVICE_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "kernels/mla/batch_steps.h"
#include "server/engine/engine_types.h"

namespace mlaserve::engine {

class KvStore;
class ModelWeights;
class ExpansionBuilder;
class PageWriteListener;

struct DeviceRun {
  std::unique_ptr<BatchBuffers> buffers;  // the batch's memory after its last step
  double modeled_us = 0;                  // modelled device time of the batch (0 on the host)
  // A device with a clock of its own (a GPU): its time from first launch to last, and what
  // crossed the bus to it (all of it, and the KV rows written since the last batch).
  double device_us = 0;
  int64_t bytes_to_device = 0;
  int64_t kv_bytes_to_device = 0;
  int64_t query_bytes_in_place = 0;  // read from mapped host memory instead (MapHostMemory)
};

// What a device with memory of its own needs the KV store to be created with: to be told of
// every write into the page pool, to build the expansions where it keeps them, and the
// budget its free memory allows (0: none).
struct KvResidency {
  std::shared_ptr<PageWriteListener> page_writes;
  std::shared_ptr<ExpansionBuilder> expansions;
  int64_t default_budget_bytes = 0;
};

// What the planner and the pool know of a device: it runs a batch's steps
// (kernels/mla/batch_steps.h). The emulated NPU is one; the host (CPU-direct) is another; a
// GPU (gpu_attention_device.h) is the third. The emulated NPU computes a step exactly as the
// host runner does, bit for bit; a GPU within floating-point tolerance (FlashMLA's) of the
// fp64 golden: a batch's answers do not depend beyond that on which device ran it.
class AttentionDevice {
 public:
  virtual ~AttentionDevice() = default;
  virtual const DeviceInfo& info() const = 0;
  // Runs one batch; not called concurrently on one device. The buffers may hold device
  // memory: release them before the device goes.
  virtual absl::StatusOr<DeviceRun> Run(const BatchSteps& steps) = 0;

  // OK, or the fault that took the device out of service (UNAVAILABLE): the engine stops
  // sending it batches and the server stops serving.
  virtual absl::Status health() const { return absl::OkStatus(); }

  // Devices that read the host's memory in place (the host, the emulated NPU) need nothing of
  // the store: UNIMPLEMENTED. A device with memory of its own says what it needs, given the
  // weights' size; after the store exists, Attach binds them (uploads the weights, allocates
  // its copy of the pool).
  virtual absl::StatusOr<KvResidency> PlanKvResidency(int64_t /*weights_bytes*/) {
    return absl::UnimplementedError("the device reads the host's memory");
  }
  virtual absl::Status Attach(const ModelWeights& /*weights*/, const KvStore& /*store*/) {
    return absl::OkStatus();
  }
  virtual std::optional<DeviceMemory> memory() const { return std::nullopt; }

  // Host memory (a data plane's region) the device is to read queries from in place, its own
  // upload being the one copy (GpuRuntime::MapHost); a null handle where it does not (the
  // host and the emulated NPU compute on the host's memory, which the caller keeps copying
  // into memory no client can rewrite). Thread-safe; the mapping ends with the handle.
  virtual std::shared_ptr<void> MapHostMemory(const void* /*data*/, int64_t /*bytes*/) {
    return nullptr;
  }

  // Host CPUs that idle devices of the pool lend this one beyond its own, from now until told
  // otherwise (DevicePool): a device whose host threads can use them runs on them too.
  // Thread-safe, and may come while it runs; devices that compute elsewhere ignore it.
  virtual void LendCpus(int /*cpus*/) {}
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_ATTENTION_DEVICE_H_
