#ifndef MLASERVE_SERVER_ENGINE_DEVICES_DEVICE_POOL_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_DEVICE_POOL_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "server/engine/devices/attention_device.h"

namespace mlaserve::engine {

// N devices, each with its own worker thread. A batch goes to the least-loaded device
// (fewest batches queued or running; ties to the lowest index) and runs on that device's
// thread, which owns the device while it runs.
//
// With `lend_idle_cpus`, the host threads of the devices with nothing queued or running are
// lent to the devices running a batch, shared out evenly (AttentionDevice::LendCpus), and
// shared out again whenever a batch starts or ends: a lone batch runs on as many CPUs as its
// device has threads (up to 8, LentThreads), and a lender that gets a batch of its own takes
// its CPUs back at once (the borrower's extra workers stop after their current instruction),
// so under load every device runs on its own.
//
// A device holds at most kBatchesPerDevice batches (one running, one waiting), and the
// batcher cuts a batch only when some device has room (HasCapacity): under load, queries
// wait in the batcher's bounded queue, where they keep joining the next batch, not in
// unbounded device queues.
class DevicePool {
 public:
  static constexpr int kBatchesPerDevice = 2;

  // Runs on the device's worker thread with the device and its pool index.
  using Job = absl::AnyInvocable<void(AttentionDevice& device, int index) &&>;

  explicit DevicePool(std::vector<std::unique_ptr<AttentionDevice>> devices,
                      bool lend_idle_cpus = false);
  ~DevicePool();  // finishes queued batches, then joins
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  int size() const { return static_cast<int>(slots_.size()); }
  const DeviceInfo& info(int device) const { return slots_[device]->device->info(); }
  // For the device's thread-safe queries (health, memory); Run stays its worker's.
  const AttentionDevice& device(int device) const { return *slots_[device]->device; }

  // In one look (the batching decision wants both at the same instant): the devices with
  // nothing queued or running, and whether any has room for another batch.
  struct Occupancy {
    int idle = 0;
    bool has_room = false;
  };
  Occupancy occupancy() const;
  // Called (from a worker thread, with no lock held) whenever a device finishes a batch.
  void SetOnCapacity(absl::AnyInvocable<void()> on_capacity);

  void Submit(Job job);

  // Every device's AttentionDevice::MapHostMemory as one handle, or null unless every device
  // reads the memory in place (a mixed pool copies, as the host's devices need).
  std::shared_ptr<void> MapHostMemory(const void* data, int64_t bytes);

 private:
  struct Slot {
    std::unique_ptr<AttentionDevice> device;
    std::deque<Job> queue;  // guarded by DevicePool::mu_
    int load = 0;           // queued + running; guarded by DevicePool::mu_
    bool running = false;   // guarded by DevicePool::mu_
    int lent = 0;           // CPUs lent to it now; guarded by DevicePool::mu_
    std::thread worker;
  };
  void Work(int index);
  // Shares the idle devices' host threads out over the running ones (under mu_); `started`
  // is told even when its share is unchanged.
  void Relend(int started);

  const bool lend_idle_cpus_;
  mutable std::mutex mu_;
  std::condition_variable work_;
  bool stopping_ = false;                   // guarded by mu_
  absl::AnyInvocable<void()> on_capacity_;  // set before the first Submit
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_DEVICE_POOL_H_
