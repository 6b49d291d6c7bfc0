#include "server/engine/devices/device_pool.h"

#include <utility>

namespace mlaserve::engine {

DevicePool::DevicePool(std::vector<std::unique_ptr<AttentionDevice>> devices) {
  for (auto& device : devices) {
    auto slot = std::make_unique<Slot>();
    slot->device = std::move(device);
    slots_.push_back(std::move(slot));
  }
  for (int i = 0; i < size(); ++i) slots_[i]->worker = std::thread([this, i] { Work(i); });
}

DevicePool::~DevicePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  capacity_.notify_all();
  for (auto& slot : slots_) slot->worker.join();
}

void DevicePool::AwaitCapacity() {
  std::unique_lock<std::mutex> lock(mu_);
  capacity_.wait(lock, [&] {
    if (stopping_) return true;
    for (const auto& slot : slots_) {
      if (slot->load < kBatchesPerDevice) return true;
    }
    return false;
  });
}

void DevicePool::Submit(std::shared_ptr<const BatchPlan> plan, const ModelWeights& weights,
                        Done done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    int best = 0;
    for (int i = 1; i < size(); ++i) {
      if (slots_[i]->load < slots_[best]->load) best = i;
    }
    ++slots_[best]->load;
    slots_[best]->queue.push_back(Job{std::move(plan), &weights, std::move(done)});
  }
  work_.notify_all();
}

void DevicePool::Work(int index) {
  Slot& slot = *slots_[index];
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_.wait(lock, [&] { return stopping_ || !slot.queue.empty(); });
    if (slot.queue.empty()) return;  // stopping, nothing left
    Job job = std::move(slot.queue.front());
    slot.queue.pop_front();
    lock.unlock();
    absl::StatusOr<DeviceRun> run = slot.device->Run(*job.plan, *job.weights);
    job.plan.reset();  // release the plan's pins before answering
    std::move(job.done)(index, std::move(run));
    lock.lock();
    --slot.load;
    capacity_.notify_all();
  }
}

}  // namespace mlaserve::engine
