#ifndef MLASERVE_KERNELS_CORE_JOB_POOL_H_
#define MLASERVE_KERNELS_CORE_JOB_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace mlaserve {

// Runs the independent jobs 0..count-1 of one step on a fixed set of threads: the caller's
// and `threads - 1` workers that live as long as the pool (so per-thread state such as
// oneDNN's primitives is built once). Jobs are taken in index order, one at a time. One Run
// at a time.
class JobPool {
 public:
  explicit JobPool(int threads);
  ~JobPool();
  JobPool(const JobPool&) = delete;
  JobPool& operator=(const JobPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  void Run(int64_t count, absl::FunctionRef<void(int64_t)> job);

 private:
  void WorkerLoop();
  // Takes jobs until none is left.
  void Drain();

  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable done_;
  // Guarded by mu_:
  uint64_t generation_ = 0;  // bumped by every Run: workers join each round once
  int64_t next_ = 0;
  int64_t count_ = 0;
  int64_t finished_ = 0;
  const absl::FunctionRef<void(int64_t)>* job_ = nullptr;
  bool stopping_ = false;

  std::vector<std::thread> workers_;
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_JOB_POOL_H_
