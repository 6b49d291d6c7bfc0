#include "server/engine/batching/batcher.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace mlaserve::engine {

Batcher::Batcher(Options options, RunBatch run, AwaitCapacity await_capacity)
    : options_(options),
      run_(std::move(run)),
      await_capacity_(std::move(await_capacity)),
      thread_([this] { Loop(); }) {}

Batcher::~Batcher() {
  Stop();
  thread_.join();
}

absl::Status Batcher::Enqueue(PendingCall& call) {
  const int n = static_cast<int>(call.queries.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return absl::UnavailableError("the engine is draining");
    if (queued_queries_ + n > options_.max_queue) {
      return absl::UnavailableError(absl::StrCat("decode queue full: ", queued_queries_,
                                                 " queries waiting, limit ", options_.max_queue,
                                                 "; retry with backoff"));
    }
    queued_queries_ += n;
    queue_.push_back(std::move(call));
  }
  changed_.notify_all();
  return absl::OkStatus();
}

void Batcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  changed_.notify_all();
}

int Batcher::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_queries_;
}

void Batcher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped and drained
    // Wait for the batch to fill, at most until the oldest call's max_wait has passed.
    const absl::Time cut = queue_.front().submitted + options_.max_wait;
    changed_.wait_until(lock, absl::ToChronoTime(cut), [&] {
      return stopped_ || queued_queries_ >= options_.max_batch;
    });
    lock.unlock();
    await_capacity_();  // meanwhile the queue keeps filling the batch
    lock.lock();
    std::vector<PendingCall> batch;
    int size = 0;
    while (!queue_.empty()) {
      const int n = static_cast<int>(queue_.front().queries.size());
      if (!batch.empty() && size + n > options_.max_batch) break;
      size += n;
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    queued_queries_ -= size;
    lock.unlock();
    run_(std::move(batch));
    lock.lock();
  }
}

}  // namespace mlaserve::engine
