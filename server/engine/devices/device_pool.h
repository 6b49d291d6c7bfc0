#ifndef MLASERVE_SERVER_ENGINE_DEVICES_DEVICE_POOL_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_DEVICE_POOL_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "server/engine/devices/attention_device.h"
#include "server/engine/plan/batch_plan.h"
#include "server/engine/model/model_weights.h"

namespace mlaserve::engine {

// N devices, each with its own worker thread. A batch goes to the least-loaded device (fewest
// batches queued or running; ties to the lowest index); its completion is delivered on that
// device's thread. A device that fails fails only the batch it was running.
//
// A device holds at most kBatchesPerDevice batches (one running, one planned and waiting),
// and the batcher cuts a batch only when some device has room (AwaitCapacity): under load,
// queries wait in the batcher's bounded queue, where they keep joining the next batch, not
// in unbounded device queues.
class DevicePool {
 public:
  static constexpr int kBatchesPerDevice = 2;

  using Done = absl::AnyInvocable<void(int device, absl::StatusOr<DeviceRun> run) &&>;

  explicit DevicePool(std::vector<std::unique_ptr<AttentionDevice>> devices);
  ~DevicePool();  // finishes queued batches, then joins
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  int size() const { return static_cast<int>(slots_.size()); }
  const DeviceInfo& info(int device) const { return slots_[device]->device->info(); }

  // Blocks until some device holds fewer than kBatchesPerDevice batches (or the pool stops).
  void AwaitCapacity();
  void Submit(std::shared_ptr<const BatchPlan> plan, const ModelWeights& weights, Done done);

 private:
  struct Job {
    std::shared_ptr<const BatchPlan> plan;
    const ModelWeights* weights;
    Done done;
  };
  struct Slot {
    std::unique_ptr<AttentionDevice> device;
    std::deque<Job> queue;  // guarded by DevicePool::mu_
    int load = 0;           // queued + running; guarded by DevicePool::mu_
    std::thread worker;
  };
  void Work(int index);

  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable capacity_;
  bool stopping_ = false;  // guarded by mu_
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_DEVICE_POOL_H_
