#include "kernels/core/job_pool.h"

#include <algorithm>

namespace mlaserve {

JobPool::JobPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

JobPool::~JobPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void JobPool::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  while (next_ < count_) {
    const int64_t index = next_++;
    const auto* job = job_;
    lock.unlock();
    (*job)(index);
    lock.lock();
    if (++finished_ == count_) done_.notify_all();
  }
}

void JobPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    Drain();
  }
}

void JobPool::Run(int64_t count, absl::FunctionRef<void(int64_t)> job) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    for (int64_t i = 0; i < count; ++i) job(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    next_ = 0;
    count_ = count;
    finished_ = 0;
    ++generation_;
  }
  work_.notify_all();
  Drain();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return finished_ == count_; });
  job_ = nullptr;
  count_ = 0;
  next_ = 0;
}

}  // namespace mlaserve
