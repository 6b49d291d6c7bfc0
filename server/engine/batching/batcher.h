#ifndef MLASERVE_SERVER_ENGINE_BATCHING_BATCHER_H_
#define MLASERVE_SERVER_ENGINE_BATCHING_BATCHER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/engine/batching/batch_policy.h"
#include "server/engine/engine_types.h"

namespace mlaserve::engine {

// One Decode call waiting for a batch. Its queries stay together in one batch.
struct PendingCall {
  std::vector<DecodeQuery> queries;
  DecodeOptions options;
  BatchKey key;
  DecodeCallback done;
  absl::Time submitted;
};

// Dynamic batching across calls: queued calls are cut into batches of at most `max_batch`
// queries (a call is never split), all of one BatchKey (the oldest call's; the others keep
// their place for the next batch), when the BatchPolicy says so, and each batch is handed to
// `run` on the batcher's thread (which should plan and dispatch, not compute). Beyond
// `max_queue` waiting queries calls are refused.
class Batcher {
 public:
  struct Options {
    BatchPolicy policy;
    int max_queue = 4096;  // queries waiting
  };
  using RunBatch = std::function<void(std::vector<PendingCall>)>;
  // The device pool's state, as the policy needs it.
  using Devices = std::function<BatchPolicy::Devices()>;

  // A batcher with its own thread on the real clock. Call DevicesChanged() whenever a device
  // finishes a batch.
  Batcher(Options options, RunBatch run, Devices devices);
  // A batcher without a thread, driven by Step() on a clock the caller keeps (tests).
  static std::unique_ptr<Batcher> Manual(Options options, RunBatch run, Devices devices);
  ~Batcher();  // stops, runs what is still queued, joins
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // UNAVAILABLE once stopped or when the queue cannot take the call's queries (transient:
  // the queue drains by itself, unlike a full KV cache, which is RESOURCE_EXHAUSTED). On
  // error the call is handed back untouched (its callback not invoked).
  absl::Status Enqueue(PendingCall& call);
  // A device finished a batch: the policy may cut now.
  void DevicesChanged();
  // Refuses further calls; those already queued still run.
  void Stop();
  // Stops and waits until every queued call has been handed to `run` (the thread ends; a
  // manual batcher runs them on the caller's thread). Idempotent; the destructor calls it.
  void Shutdown();
  int queued() const;

  // Cuts and runs every batch the policy allows at `now`; returns when time alone would let
  // it cut next (InfiniteFuture if only a device or a new call can).
  absl::Time Step(absl::Time now);

 private:
  Batcher(Options options, RunBatch run, Devices devices, bool threaded);
  void Loop();
  // Takes the next batch off the queue if the policy (or stopping) says so. Requires mu_.
  bool TakeBatch(absl::Time now, std::vector<PendingCall>& batch, absl::Time& recheck);

  const Options options_;
  const RunBatch run_;
  const Devices devices_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<PendingCall> queue_;  // guarded by mu_
  int queued_queries_ = 0;         // guarded by mu_
  bool stopped_ = false;           // guarded by mu_
  std::thread thread_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_BATCHING_BATCHER_H_
