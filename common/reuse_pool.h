#ifndef MLASERVE_COMMON_REUSE_POOL_H_
#define MLASERVE_COMMON_REUSE_POOL_H_

#include <memory>
#include <mutex>
#include <vector>

namespace mlaserve {

// Objects reused from call to call (the UCX data plane's buffers and messages, both sides): a
// framework's calls have the same shapes step after step, so after the first a call's
// buffers and messages find their memory already allocated (and faulted in), and a
// protobuf message's strings keep their capacity. Items go back when their last user
// lets go (an engine thread, for a call in flight); at most `keep` idle ones are kept.
template <typename T>
class ReusePool : public std::enable_shared_from_this<ReusePool<T>> {
 public:
  static std::shared_ptr<ReusePool> Create(size_t keep) {
    return std::shared_ptr<ReusePool>(new ReusePool(keep));
  }
  std::shared_ptr<T> Take() {
    std::unique_ptr<T> item;
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        item = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (item == nullptr) item = std::make_unique<T>();
    return std::shared_ptr<T>(item.release(), [pool = this->shared_from_this()](T* p) {
      pool->Give(std::unique_ptr<T>(p));
    });
  }

 private:
  explicit ReusePool(size_t keep) : keep_(keep) {}
  void Give(std::unique_ptr<T> item) {
    std::lock_guard lock(mu_);
    if (idle_.size() < keep_) idle_.push_back(std::move(item));
  }
  const size_t keep_;
  std::mutex mu_;
  std::vector<std::unique_ptr<T>> idle_;
};

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_REUSE_POOL_H_
