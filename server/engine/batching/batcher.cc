#include "server/engine/batching/batcher.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mlaserve::engine {

Batcher::Batcher(Options options, RunBatch run, Devices devices)
    : Batcher(options, std::move(run), std::move(devices), true) {}

Batcher::Batcher(Options options, RunBatch run, Devices devices, bool threaded)
    : options_(options), run_(std::move(run)), devices_(std::move(devices)) {
  if (threaded) thread_ = std::thread([this] { Loop(); });
}

std::unique_ptr<Batcher> Batcher::Manual(Options options, RunBatch run, Devices devices) {
  return std::unique_ptr<Batcher>(new Batcher(options, std::move(run), std::move(devices), false));
}

Batcher::~Batcher() { Shutdown(); }

void Batcher::Shutdown() {
  Stop();
  if (thread_.joinable()) {
    thread_.join();
  } else {
    Step(absl::InfiniteFuture());  // a manual batcher runs what is left on the caller's thread
  }
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

void Batcher::DevicesChanged() {
  // Taking the lock orders this notification after a waiter's last look at the devices.
  { std::lock_guard<std::mutex> lock(mu_); }
  changed_.notify_all();
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

bool Batcher::TakeBatch(absl::Time now, std::vector<PendingCall>& batch, absl::Time& recheck) {
  recheck = absl::InfiniteFuture();
  if (queue_.empty()) return false;
  if (!stopped_) {
    const BatchPolicy::Decision decision =
        options_.policy.Decide(now, queue_.front().submitted, queued_queries_, devices_());
    if (!decision.cut) {
      recheck = decision.recheck;
      return false;
    }
  }
  // A device batch applies one scale and one head range: calls asking for others wait, in
  // order, for the next batch.
  const BatchKey key = queue_.front().key;
  int size = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (!(it->key == key)) {
      ++it;
      continue;
    }
    const int n = static_cast<int>(it->queries.size());
    if (!batch.empty() && size + n > options_.policy.max_batch) break;
    size += n;
    batch.push_back(std::move(*it));
    it = queue_.erase(it);
  }
  queued_queries_ -= size;
  return true;
}

absl::Time Batcher::Step(absl::Time now) {
  std::unique_lock<std::mutex> lock(mu_);
  absl::Time recheck = absl::InfiniteFuture();
  std::vector<PendingCall> batch;
  while (TakeBatch(now, batch, recheck)) {
    lock.unlock();
    run_(std::move(batch));
    batch.clear();
    lock.lock();
  }
  return recheck;
}

void Batcher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    absl::Time recheck = absl::InfiniteFuture();
    std::vector<PendingCall> batch;
    if (TakeBatch(absl::Now(), batch, recheck)) {
      lock.unlock();
      run_(std::move(batch));
      lock.lock();
      continue;
    }
    if (stopped_ && queue_.empty()) return;
    // Woken by a new call, a device finishing (DevicesChanged) or the policy's time.
    if (recheck == absl::InfiniteFuture()) {
      changed_.wait(lock);
    } else {
      changed_.wait_until(lock, absl::ToChronoTime(recheck));
    }
  }
}

}  // namespace mlaserve::engine
