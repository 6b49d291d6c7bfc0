#ifndef MLASERVE_SERVER_ENGINE_ENGINE_H_
#define MLASERVE_SERVER_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/tensor_view.h"
#include "server/engine/kv_store.h"
#include "server/engine/model_config.h"

namespace mlaserve::engine {

// The server's engine: state (KV store, model weights), planning (TyphoonMLA naive/absorb
// per group) and execution (a pool of emulated devices), behind one thread-safe interface.
// The gRPC service is a thin edge over it; everything here is usable without a network.

// How a decode query's q is expressed.
enum class QuerySpace {
  // What the model's q projection produces: q_nope [sq][heads][dn] and RoPE'd
  // q_pe [sq][heads][dr]. The engine absorbs W_UK and maps outputs back with W_UV:
  // outputs are [sq][heads][dv].
  kHead,
  // Already absorbed (FlashMLA's semantics): q [sq][heads][dl + dr]; outputs are the
  // latent [sq][heads][dl]. Always runs absorb-only (the naive form needs q_nope).
  kLatent,
};

struct DecodeQuery {
  std::string sequence_id;
  int layer = 0;
  int sq = 1;  // query tokens (MTP); causal among them
  QuerySpace space = QuerySpace::kHead;
  std::vector<Bf16> q_nope;    // kHead: [sq][heads][dn]
  std::vector<Bf16> q_pe;      // kHead: [sq][heads][dr]
  std::vector<Bf16> q_latent;  // kLatent: [sq][heads][dl + dr]
  // Optional KV rows [n][dl + dr] appended to (sequence, layer) at `append_position` before
  // attending, with KvStore::Append's retry semantics. -1: nothing to append.
  std::vector<Bf16> append_rows;
  int64_t append_position = -1;
};

enum class Formulation {
  kAbsorb,  // absorb-only over the whole context
  kHybrid,  // TyphoonMLA: naive over the shared prefix + absorb over the suffix, LSE-merged
};

// How one query was run, for responses, metrics and tests.
struct PlanInfo {
  Formulation formulation = Formulation::kAbsorb;
  std::string prefix_id;      // the shared prefix its group formed on, "" if none
  int group_size = 0;         // queries in that group (the B compared with b_theta)
  double b_theta = 0;         // the threshold applied
  int device = -1;            // pool index of the device that ran the batch
  int batch_size = 0;         // queries in the device batch
  double queue_us = 0;        // submit -> device start: batching, planning, device queue
  double device_modeled_us = 0;  // modelled device time of the batch
  double device_host_ms = 0;     // host wall time of the batch's device work
};

struct DecodeAnswer {
  std::vector<float> out;  // kHead: [sq][heads][dv]; kLatent: [sq][heads][dl]; normalised
  std::vector<float> lse;  // [sq][heads], natural log; -inf for a token that saw no key
  PlanInfo plan;
};

struct DecodeOptions {
  absl::Time deadline = absl::InfiniteFuture();
  // Polled before device work and after it; true abandons the request (CANCELLED).
  std::function<bool()> cancelled;
};

// Called exactly once per Decode: either every answer in query order, or one status for the
// whole call. Errors found while validating or queueing are answered inline, on the caller's
// thread; everything else on an engine thread.
using DecodeCallback = absl::AnyInvocable<void(absl::StatusOr<std::vector<DecodeAnswer>>) &&>;

// What a device batch looked like, reported once per batch (metrics).
struct BatchReport {
  int device = -1;
  int queries = 0;
  int hybrid_groups = 0;
  int absorb_groups = 0;
  double modeled_us = 0;
  double host_ms = 0;
  absl::Status status;
};

struct DeviceInfo {
  std::string profile;
  int host_threads = 0;
  double matrix_tflops = 0;  // peak, from the profile
  double hbm_tbps = 0;
};

struct EngineInfo {
  ModelConfig model;
  int page_size = 0;
  std::vector<DeviceInfo> devices;
  std::vector<double> b_theta_by_sq;  // [sq - 1] for sq = 1..max_sq
  int max_batch = 0;                  // queries per device batch
  int max_sq = 0;
  int max_queue = 0;                  // queries waiting; beyond it Decode is refused
  absl::Duration max_wait;            // how long a batch waits to fill
  int64_t kv_budget_bytes = 0;
};

struct EngineStats {
  KvStoreStats kv;
  int64_t batches = 0;
  int64_t queries = 0;
  int64_t hybrid_groups = 0;
  int64_t absorb_groups = 0;
  int queued = 0;  // queries waiting right now
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual const EngineInfo& Info() const = 0;

  // KV state, with KvStore's semantics: client-chosen ids, idempotent under retry,
  // RESOURCE_EXHAUSTED leaves everything as it was.
  virtual absl::Status RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                                      TensorView<const Bf16, 3> latent) = 0;  // [layers][n][576]
  virtual absl::Status ReleasePrefix(absl::string_view prefix_id) = 0;
  virtual absl::Status CreateSequence(absl::string_view sequence_id,
                                      absl::string_view prefix_id) = 0;
  virtual absl::Status ForkSequence(absl::string_view source_id, absl::string_view new_id) = 0;
  virtual absl::Status ReleaseSequence(absl::string_view sequence_id) = 0;
  virtual absl::Status AppendKv(absl::string_view sequence_id, int layer, int64_t start_position,
                                TensorView<const Bf16, 2> rows) = 0;  // [n][576]
  virtual absl::StatusOr<SequenceInfo> GetSequence(absl::string_view sequence_id) const = 0;

  // Validates the queries (INVALID_ARGUMENT / NOT_FOUND naming the field, nothing changed),
  // queues them to be batched with other callers' queries, and answers through `done`.
  // A full queue or a draining engine answers UNAVAILABLE at once (retryable: the queue
  // drains by itself); RESOURCE_EXHAUSTED is kept for memory (an append that does not fit).
  virtual void Decode(std::vector<DecodeQuery> queries, DecodeOptions options,
                      DecodeCallback done) = 0;

  virtual EngineStats Stats() const = 0;

  // Stops accepting decodes (UNAVAILABLE) and waits for those in flight, at most until
  // `deadline`; DEADLINE_EXCEEDED if some were still running.
  virtual absl::Status Drain(absl::Time deadline) = 0;
};

// Where the up-projection weights come from.
struct WeightsSource {
  std::string safetensors_path;  // a DeepSeek-layout kv_b_proj file, or
  uint64_t seed = 0;             // generated from this seed when the path is empty
};

struct EngineOptions {
  ModelConfig model;
  WeightsSource weights;
  KvStoreOptions kv;
  int devices = 2;
  // A device profile name or path (kernels/npu/profiles), or "host" for the CPU-direct device.
  std::string profile = "ascend910-die";
  int host_threads_per_device = 1;
  int preload = 2;  // the AMLA kernel's preload count on emulated devices (0, 1 or 2)
  int max_batch = 256;
  absl::Duration max_wait = absl::Microseconds(500);
  int max_queue = 4096;
  int max_sq = 4;
  // Overrides of the device rates the TyphoonMLA threshold is computed from (the paper's
  // B_theta = 61 uses 376 TFLOPS and 1.8 TB/s); 0 means "from the profile".
  double matrix_tflops = 0;
  double hbm_tbps = 0;
  // Called once per device batch (from an engine thread).
  std::function<void(const BatchReport&)> on_batch;
};

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(EngineOptions options);

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_ENGINE_H_
