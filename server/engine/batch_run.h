#ifndef MLASERVE_SERVER_ENGINE_BATCH_RUN_H_
#define MLASERVE_SERVER_ENGINE_BATCH_RUN_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/engine/batching/batcher.h"
#include "server/engine/devices/attention_device.h"
#include "server/engine/engine_types.h"
#include "server/engine/kv/kv_store.h"
#include "server/engine/model/model_weights.h"
#include "server/engine/plan/batch_plan.h"
#include "server/engine/plan/planner.h"

namespace mlaserve::engine {

// The engine's running totals (EngineStats), kept by the batches: batches and queries as
// they are cut, groups by formulation as they run (preparation may fall back to absorb).
struct BatchCounters {
  std::atomic<int64_t> batches{0}, queries{0}, hybrid_groups{0}, absorb_groups{0};
};

// What a batch needs of the engine that cut it.
struct BatchContext {
  KvStore& store;
  const ModelWeights& weights;
  const Planner& planner;
  const DeviceInfo& device;  // the pool's (its first device's): how steps are split
  const std::function<void(const BatchReport&)>& on_batch;
  BatchCounters& counters;
  // Told once per call when its callback has run (the engine's drain counts them).
  std::function<void()> call_answered;
};

// One device batch from its cut to its answers, each stage named once (docs/architecture.md
// follows a Decode through them):
//   1. Start        batcher thread  apply the calls' appends; a call whose append fails (or
//                                   whose deadline passed, or that was cancelled) is answered
//                                   now; snapshot and plan the rest (no matrix work)
//   2. Execute      device thread   prepare: build the passes' expansions, lower the plan to
//                                   the kernels' steps;
//                                   run: the device runs the steps;
//                                   complete: every call's answers, views of the device's
//                                   buffers, go to its callback; then the buffers go
// The object owns the calls from Start until each is answered, exactly once.
class BatchRun {
 public:
  // nullptr when no call is left to run.
  static std::unique_ptr<BatchRun> Start(std::vector<PendingCall> calls, BatchContext& context);
  ~BatchRun();
  BatchRun(const BatchRun&) = delete;
  BatchRun& operator=(const BatchRun&) = delete;

  int queries() const { return static_cast<int>(origin_.size()); }
  void Execute(AttentionDevice& device, int device_index);

 private:
  BatchRun(std::vector<PendingCall> calls, BatchContext& context);
  void Plan();
  // Answers a call with a status or its answers and tells the engine.
  void Answer(size_t call, absl::StatusOr<std::span<const DecodeAnswer>> result);

  BatchContext& context_;
  std::vector<PendingCall> calls_;
  std::vector<absl::Status> call_status_;  // a planning failure of one of its queries
  std::vector<char> answered_;
  std::vector<std::pair<int, int>> origin_;  // batch index -> (call, query)
  std::unique_ptr<BatchPlan> plan_;
  // Every call's (the batcher batches one key together): scale and head range.
  const BatchKey key_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_BATCH_RUN_H_
