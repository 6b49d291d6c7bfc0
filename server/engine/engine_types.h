#ifndef MLASERVE_SERVER_ENGINE_ENGINE_TYPES_H_
#define MLASERVE_SERVER_ENGINE_ENGINE_TYPES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/element_type.h"
#include "kernels/core/kv_dtype.h"
#include "kernels/core/tensor_view.h"
#include "server/engine/kv/kv_types.h"
#include "server/engine/model/model_config.h"

namespace mlaserve::engine {

// The value types of the engine's interface (engine.h): what a Decode asks and answers, and
// what the engine reports about itself. The engine's parts (planner, devices, batching) use
// them without depending on the engine.

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
  // Row-major views of the caller's memory (a wire request's bytes, say), which must stay
  // valid and unchanged until the Decode's callback has run: the engine copies them once,
  // into the device's batch.
  TensorView<const Bf16, 3> q_nope;    // kHead: [sq][heads][dn]
  TensorView<const Bf16, 3> q_pe;      // kHead: [sq][heads][dr]
  TensorView<const Bf16, 3> q_latent;  // kLatent: [sq][heads][dl + dr]
  // kHead: q holds the model's heads [first_head, first_head + heads) (a tensor-parallel
  // rank's share); 0 with all of them. kLatent: 0, and any number of heads (no weights).
  int first_head = 0;
  // Optional KV rows [n][dl + dr] appended to (sequence, layer) at `append_position` before
  // attending, with KvStore::Append's retry semantics. -1: nothing to append.
  TensorView<const Bf16, 2> append_rows;
  int64_t append_position = -1;
  // The answer's element type: bf16 (rounded to nearest even on the device) or fp32 (the
  // value before rounding, e.g. to merge partial results by LSE).
  ElementType output = ElementType::kBf16;
};

// The heads a query carries: dim 1 of its q.
inline int QueryHeads(const DecodeQuery& q) {
  return static_cast<int>(q.space == QuerySpace::kHead ? q.q_nope.dim(1) : q.q_latent.dim(1));
}

// Most heads a latent query may carry (a multiple of the presets' 128, for grouped queries).
inline constexpr int kMaxLatentHeads = 1024;

enum class Formulation {
  kAbsorb,  // absorb-only over the whole context
  kHybrid,  // TyphoonMLA: naive over the shared prefix + absorb over the suffix, LSE-merged
};

// How one query was run, for responses, metrics and tests.
struct PlanInfo {
  Formulation formulation = Formulation::kAbsorb;
  std::string prefix_id;  // the shared prefix its group formed on, "" if none
  int group_size = 0;     // queries in that group
  double b_theta = 0;     // the threshold applied (for the group's sq)
  // Hybrid: the keys run in naive form (the prefix levels whose passes ran), and the query
  // tokens (queries x sq) that shared the first of those passes: the B Sq that cleared
  // B_theta(1) Sq; with tree-aware grouping it counts every group under that prefix.
  int32_t naive_tokens = 0;
  int naive_pass_query_tokens = 0;
  // The format the absorb part read (its sequences'); the naive part always reads bf16
  // expanded K/V, expanded from dequantised rows for an FP8 prefix.
  KvDtype absorb_kv_dtype = KvDtype::kBf16;
  int device = -1;               // pool index of the device that ran the batch
  int batch_size = 0;            // queries in the device batch
  double queue_us = 0;           // submit -> device start: batching, planning, device queue
  double prepare_us = 0;         // on the device's thread before it ran: expansions, steps
  double device_modeled_us = 0;  // modelled device time of the batch
  double device_host_ms = 0;     // host wall time of the batch's device work
};

// A query's answer: views of the batch's device memory, valid only while the Decode's
// callback runs (copy what must outlive it).
struct DecodeAnswer {
  // kHead: [sq][heads][dv]; kLatent: [sq][heads][dl]; normalised, in `out_type` (the query's
  // `output`, or fp32 when its group holds queries that asked for both).
  ElementType out_type = ElementType::kFp32;
  const void* out = nullptr;
  int64_t out_elements = 0;
  std::span<const float> lse;  // [sq][heads], natural log; -inf for a token that saw no key
  PlanInfo plan;

  std::span<const float> out_fp32() const {
    return {static_cast<const float*>(out),
            static_cast<size_t>(out_type == ElementType::kFp32 ? out_elements : 0)};
  }
  std::span<const Bf16> out_bf16() const {
    return {static_cast<const Bf16*>(out),
            static_cast<size_t>(out_type == ElementType::kBf16 ? out_elements : 0)};
  }
};

struct DecodeOptions {
  absl::Time deadline = absl::InfiniteFuture();
  // The factor on q.k for this call's queries, applied in fp32 as the model's own is; nullopt
  // is the model's (ModelConfig::softmax_scale). A device batch applies one scale, so calls
  // with different scales are batched apart. Finite and positive (ValidateDecodeOptions).
  std::optional<float> softmax_scale;
  // The batch-invariant mode (docs/numerics.md, "Batch-invariant answers"): each answer bit
  // for bit what the query gets alone, whatever else shares its batch (absorb-only, split
  // parts of a fixed length). nullopt: the engine's default (EngineOptions::batch_invariant).
  // Calls in the mode are batched apart from calls out of it.
  std::optional<bool> batch_invariant;
  // Polled before device work and after it; true abandons the request (CANCELLED).
  std::function<bool()> cancelled;
};

// What every call of a device batch shares: the kernels apply one softmax scale and one
// head range per batch, and a batch is batch-invariant or not as a whole. The engine fills
// every field when it queues a call (batching/batcher.h).
struct BatchKey {
  float softmax_scale = 0;
  int heads = 0;
  int first_head = 0;
  bool batch_invariant = false;
  bool operator==(const BatchKey&) const = default;
};

// Called exactly once per Decode: either every answer in query order, or one status for the
// whole call. Errors found while validating or queueing are answered inline, on the caller's
// thread; everything else on an engine thread. The answers' memory is the engine's and goes
// when the callback returns.
using DecodeCallback = absl::AnyInvocable<void(absl::StatusOr<std::span<const DecodeAnswer>>) &&>;

// What a device batch looked like, reported once per batch (metrics).
struct BatchReport {
  int device = -1;
  int queries = 0;
  int hybrid_groups = 0;
  int absorb_groups = 0;
  double modeled_us = 0;
  double host_ms = 0;
  // A GPU's: its own time for the batch's launches, and the bytes the batch sent it (all, and
  // the KV rows among them).
  double device_us = 0;
  int64_t bytes_to_device = 0;
  int64_t kv_bytes_to_device = 0;
  // Queries the GPU read from a data plane's mapped region instead (not in bytes_to_device).
  int64_t query_bytes_in_place = 0;
  absl::Status status;
};

// A device's own memory (a GPU's), for /metrics and GetServerInfo.
struct DeviceMemory {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  int64_t weights_bytes = 0;
  int64_t kv_pool_bytes = 0;
  int64_t expansion_bytes = 0;
  int64_t batch_bytes = 0;
};

struct DeviceInfo {
  std::string profile;  // the NPU profile's name, "host", or the GPU's name ("cuda:0")
  int host_threads = 0;
  // Cores one attention launch can keep busy (an NPU's AIC blocks, the host's threads):
  // attention steps with fewer row groups are split over them (split-KV).
  int parallel_units = 1;
  double matrix_tflops = 0;  // peak, from the profile
  double hbm_tbps = 0;
  double fp8_matrix_tflops = 0;  // peak on e4m3 operands; 0 when the matrix unit has none
  // What the device's kernels attain, where known (a GPU): the absorb pass's rate and the
  // naive pass's, which the TyphoonMLA threshold then balances instead of the peak.
  double absorb_matrix_tflops = 0;
  double naive_matrix_tflops = 0;
  std::string kind = "npu";      // npu (emulated), host, gpu
  std::string description = "";  // a GPU's model, SMs, memory and driver (open_gpu.h)
  int64_t memory_bytes = 0;      // a GPU's memory
  int unit_rows = 0;  // query rows a unit takes at a time (DecodeBatch::unit_rows); 0: a group
  // The same for a pass over expanded heads (DecodeBatch::dense_unit_rows); 0: unit_rows.
  int dense_unit_rows = 0;
  int split_block_tokens = 0;  // split parts' key multiple (DecodeBatch); 0: the kernels' 512
  bool balance_waves = false;  // DecodeBatch::balance_waves
  int split_part_overhead_blocks = 0;  // DecodeBatch's
  // DecodeBatch::invariant_projection_rows: the rows a projection job takes at most in the
  // batch-invariant mode (a CPU device's row kernel's); 0: whole groups (a GPU).
  int invariant_projection_rows = 0;
};

// How the server sized its CPU pool from the host (devices/pool_sizing.h), as reported.
struct PoolSizingInfo {
  int usable_cpus = 0;   // 0: the pool was not sized from a host (an engine made in code)
  double cpu_quota = 0;  // the cgroup's limit in CPUs; 0: none
  int numa_nodes = 0;
  std::string rule;             // what chose the pool, in words
  bool oversubscribed = false;  // more host threads than usable CPUs, as asked
};

// The machine the devices compute on.
struct HostInfo {
  std::string cpu_model;
  int logical_cores = 0;
  std::string isa;          // CpuFeatures::MatrixIsa()
  std::string matrix_unit;  // MatrixUnitBackend()
  PoolSizingInfo sizing;
};

struct EngineInfo {
  ModelConfig model;
  HostInfo host;
  int page_size = 0;        // tokens per bf16 page
  int fp8_page_tokens = 0;  // tokens an FP8 page holds in the same bytes
  KvDtype default_kv_dtype = KvDtype::kBf16;
  std::vector<DeviceInfo> devices;
  std::vector<double> b_theta_by_sq;      // [sq - 1] for sq = 1..max_sq
  std::vector<double> fp8_b_theta_by_sq;  // the same for groups on the FP8 cache
  int max_batch = 0;                      // queries per device batch
  int max_sq = 0;
  int max_queue = 0;        // queries waiting; beyond it Decode is refused
  absl::Duration max_wait;  // how long a batch waits to fill
  int64_t kv_budget_bytes = 0;
  bool batch_invariant = false;  // the mode of calls that do not choose (DecodeOptions)
};

struct EngineStats {
  KvStoreStats kv;
  int64_t batches = 0;
  int64_t queries = 0;
  int64_t hybrid_groups = 0;
  int64_t absorb_groups = 0;
  int queued = 0;  // queries waiting right now
  // Per pool device with memory of its own (a GPU), in pool order; empty otherwise.
  std::vector<std::pair<int, DeviceMemory>> device_memory;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_ENGINE_TYPES_H_
