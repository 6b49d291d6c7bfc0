#ifndef MLASERVE_KERNELS_CORE_THREAD_SCRATCH_H_
#define MLASERVE_KERNELS_CORE_THREAD_SCRATCH_H_

#include <cstddef>
#include <span>
#include <vector>

namespace mlaserve {

// Working memory that a kernel reuses from call to call on the same thread.
//
// The host kernels run once per layer per decode step. Building their block-sized buffers
// afresh on every call cost a zero fill each time and, for blocks over malloc's mmap
// threshold (and always under AddressSanitizer), fresh pages and their faults: a third of the
// decode fuzzer's time. A ThreadScratch keeps one buffer per thread and per `Tag` (a type
// named for the call site), grown to the largest size asked and never shrunk.
//
// Contract:
//  * the contents are unspecified when it is made: the caller writes before it reads;
//  * it is valid until it goes out of scope, and stays on the thread that made it;
//  * a second live ThreadScratch with the same Tag on the same thread (a nested call) gets
//    memory of its own, as does a request over kMaxKeptBytes, so that a rare long operand is
//    not held by the thread for its whole life.
template <typename Tag, typename T>
class ThreadScratch {
 public:
  static constexpr size_t kMaxKeptBytes = size_t{4} << 20;

  explicit ThreadScratch(size_t size) : size_(size) {
    Kept& kept = ThisThreadsKept();
    if (kept.in_use || size * sizeof(T) > kMaxKeptBytes) {
      own_.resize(size);
      data_ = own_.data();
      return;
    }
    if (kept.buffer.size() < size) kept.buffer.resize(size);
    kept.in_use = true;
    holds_kept_ = true;
    data_ = kept.buffer.data();
  }

  ~ThreadScratch() {
    if (holds_kept_) ThisThreadsKept().in_use = false;
  }

  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;

  T* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<T> span() const { return {data_, size_}; }

 private:
  struct Kept {
    std::vector<T> buffer;
    bool in_use = false;
  };

  static Kept& ThisThreadsKept() {
    thread_local Kept kept;
    return kept;
  }

  T* data_ = nullptr;
  size_t size_;
  bool holds_kept_ = false;
  std::vector<T> own_;
};

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_THREAD_SCRATCH_H_
