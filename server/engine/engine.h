#ifndef MLASERVE_SERVER_ENGINE_ENGINE_H_
#define MLASERVE_SERVER_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/tensor_view.h"
#include "server/engine/engine_types.h"
#include "server/engine/kv/kv_checkpoint.h"
#include "server/engine/kv/kv_state.h"
#include "server/engine/kv/kv_types.h"
#include "server/engine/model/model_config.h"

namespace mlaserve::engine {

// The server's engine: state (KV store, model weights), planning (TyphoonMLA naive/absorb
// per group) and execution (a pool of emulated devices), behind one thread-safe interface.
// The gRPC service is a thin edge over it; everything here is usable without a network.

class Engine {
 public:
  virtual ~Engine() = default;

  virtual const EngineInfo& Info() const = 0;

  // KV state, with KvStore's semantics: client-chosen ids, idempotent under retry,
  // RESOURCE_EXHAUSTED leaves everything as it was. A prefix or sequence is held in
  // `kv_dtype`; unset, it takes its parent's or prefix's, or the server's default
  // (EngineOptions::kv.default_kv_dtype).
  virtual absl::Status RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                                      TensorView<const Bf16, 3> latent,  // [layers][n][576]
                                      std::optional<KvDtype> kv_dtype = std::nullopt) = 0;
  virtual absl::Status ReleasePrefix(absl::string_view prefix_id) = 0;
  virtual absl::Status CreateSequence(absl::string_view sequence_id, absl::string_view prefix_id,
                                      std::optional<KvDtype> kv_dtype = std::nullopt) = 0;
  virtual absl::Status ForkSequence(absl::string_view source_id, absl::string_view new_id) = 0;
  virtual absl::Status ReleaseSequence(absl::string_view sequence_id) = 0;
  virtual absl::Status AppendKv(absl::string_view sequence_id, int layer, int64_t start_position,
                                TensorView<const Bf16, 2> rows) = 0;  // [n][576]
  // `n` rows already in the FP8 form (KvStore::AppendFp8), for an FP8 sequence.
  virtual absl::Status AppendKvFp8(absl::string_view sequence_id, int layer, int64_t start_position,
                                   std::span<const std::byte> records, int64_t n) = 0;
  virtual absl::StatusOr<SequenceInfo> GetSequence(absl::string_view sequence_id) const = 0;
  // Admin listings (KvStore::ListPrefixes, KvStore::ListSequences).
  virtual ListPage<PrefixListing> ListPrefixes(const ListRange& range) const = 0;
  virtual ListPage<SequenceListing> ListSequences(const ListRange& range,
                                                  absl::string_view on_prefix_id) const = 0;

  // Validates the queries (INVALID_ARGUMENT / NOT_FOUND naming the field, nothing changed),
  // queues them to be batched with other callers' queries, and answers through `done`.
  // A full queue or a draining engine answers UNAVAILABLE at once (retryable: the queue
  // drains by itself); RESOURCE_EXHAUSTED is kept for memory (an append that does not fit).
  virtual void Decode(std::vector<DecodeQuery> queries, DecodeOptions options,
                      DecodeCallback done) = 0;

  virtual EngineStats Stats() const = 0;

  // Host memory (a same-host data plane's region) every device is to read queries from in
  // place (AttentionDevice::MapHostMemory): a handle that ends the mapping when it goes, or
  // null where the devices do not (queries in it must then be copied out before use).
  // Thread-safe.
  virtual std::shared_ptr<void> MapHostMemory(const void* /*data*/, int64_t /*bytes*/) {
    return nullptr;
  }

  // OK, or why the engine cannot serve: a device taken out of service by a fault
  // (UNAVAILABLE naming it). Decodes then fail with it at once.
  virtual absl::Status Health() const { return absl::OkStatus(); }

  // Stops accepting decodes (UNAVAILABLE) and waits for those in flight, at most until
  // `deadline`; DEADLINE_EXCEEDED if some were still running.
  virtual absl::Status Drain(absl::Time deadline) = 0;

  // Restarts that keep the cache (server/state/): KvStore::Checkpoint and KvStore::Restore
  // on the engine's store. Restore before the engine serves anything.
  virtual KvCheckpoint CheckpointKv() = 0;
  virtual absl::Status RestoreKv(const KvStateManifest& manifest, KvStatePageReader read_page) = 0;
};

// Where the up-projection weights come from.
struct WeightsSource {
  std::string safetensors_path;  // a DeepSeek-layout kv_b_proj file, or
  uint64_t seed = 0;             // generated from this seed when the path is empty
};

inline constexpr int64_t kDefaultHostKvBudget = int64_t{2} << 30;

struct EngineOptions {
  ModelConfig model;
  WeightsSource weights;
  KvStoreOptions kv;
  int devices = 2;
  // A device profile name or path (kernels/npu/profiles), or "host" for the CPU-direct device.
  std::string profile = "ascend910-die";
  // A GPU instead ("cuda:N", or "fake-gpu" in tests: kernels/gpu/open_gpu.h): the pool is that
  // one device, and the KV store lives in its memory. kv.budget_bytes 0 then means what the
  // GPU's free memory allows (GpuAttentionDevice::PlanKvResidency); on the CPU devices 0 is
  // kDefaultHostKvBudget.
  std::string gpu;
  // Host threads that run each device's work (an emulated NPU's cores, the host device's jobs).
  int host_threads_per_device = 1;
  // The CPUs a pool of emulated devices shares (devices/pool_sizing.h): > 0 gives every
  // device LentThreads(shared_cpus, host_threads_per_device) host threads, and a batch that
  // starts while other devices are idle runs on their threads' worth of CPUs too
  // (DevicePool), so a lone batch computes on up to 8 CPUs. 0: each device runs its own
  // host_threads_per_device.
  int shared_cpus = 0;
  // How the server chose `devices` and `host_threads_per_device`, reported in Info().host.
  PoolSizingInfo sizing;
  int preload = 2;  // the AMLA kernel's preload count on emulated devices (0, 1 or 2)
  int max_batch = 256;
  // The longest a query waits for others while every device is busy (batching/batch_policy.h:
  // with a device idle it does not wait at all).
  absl::Duration max_wait = absl::Microseconds(500);
  int max_queue = 4096;
  int max_sq = 4;
  // TyphoonMLA over prefix trees: groups on a prefix and on its children share the naive
  // passes over the levels they have in common (PlannerOptions::tree_aware).
  bool tree_aware_grouping = true;
  // TyphoonMLA's hybrid for head-space groups on a shared prefix that reach B_theta; false:
  // absorb-only for every group, no prefix expanded (PlannerOptions::hybrid).
  bool typhoon = true;
  // Overrides of the device rates the TyphoonMLA threshold is computed from (the paper's
  // B_theta = 61 uses 376 TFLOPS and 1.8 TB/s); 0 means "from the profile".
  double matrix_tflops = 0;
  double hbm_tbps = 0;
  // The batch-invariant mode for calls whose options do not choose (DecodeOptions::
  // batch_invariant).
  bool batch_invariant = false;
  // Called once per device batch (from an engine thread).
  std::function<void(const BatchReport&)> on_batch;
};

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(EngineOptions options);

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_ENGINE_H_
