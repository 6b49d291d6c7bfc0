#ifndef MLASERVE_SERVER_ENGINE_BATCHING_BATCHER_H_
#define MLASERVE_SERVER_ENGINE_BATCHING_BATCHER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/engine/engine_types.h"

namespace mlaserve::engine {

// One Decode call waiting for a batch. Its queries stay together in one batch.
struct PendingCall {
  std::vector<DecodeQuery> queries;
  DecodeOptions options;
  DecodeCallback done;
  absl::Time submitted;
};

// Dynamic batching across calls: a batch is cut when it would exceed `max_batch` queries or
// when its oldest call has waited `max_wait`, whichever comes first, and once
// `await_capacity` returns (a device can take it), then handed to `run` on the batcher's
// thread (which should plan and dispatch, not compute). Calls that arrive while the devices
// are busy join the next batch; beyond `max_queue` waiting queries calls are refused.
class Batcher {
 public:
  struct Options {
    int max_batch = 256;
    absl::Duration max_wait = absl::Microseconds(500);
    int max_queue = 4096;  // queries waiting
  };
  using RunBatch = std::function<void(std::vector<PendingCall>)>;
  using AwaitCapacity = std::function<void()>;

  Batcher(Options options, RunBatch run, AwaitCapacity await_capacity = [] {});
  ~Batcher();  // stops and runs what is still queued
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // UNAVAILABLE once stopped or when the queue cannot take the call's queries (transient:
  // the queue drains by itself, unlike a full KV cache, which is RESOURCE_EXHAUSTED). On error the call is handed back untouched (its callback not invoked).
  absl::Status Enqueue(PendingCall& call);
  // Refuses further calls; those already queued still run.
  void Stop();
  int queued() const;

 private:
  void Loop();

  const Options options_;
  const RunBatch run_;
  const AwaitCapacity await_capacity_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<PendingCall> queue_;  // guarded by mu_
  int queued_queries_ = 0;         // guarded by mu_
  bool stopped_ = false;           // guarded by mu_
  std::thread thread_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_BATCHING_BATCHER_H_
