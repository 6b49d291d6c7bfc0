#include "server/engine/devices/device_pool.h"

#include <utility>

namespace mlaserve::engine {

DevicePool::DevicePool(std::vector<std::unique_ptr<AttentionDevice>> devices, bool lend_idle_cpus)
    : lend_idle_cpus_(lend_idle_cpus) {
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
  for (auto& slot : slots_) slot->worker.join();
}

void DevicePool::SetOnCapacity(absl::AnyInvocable<void()> on_capacity) {
  on_capacity_ = std::move(on_capacity);
}

DevicePool::Occupancy DevicePool::occupancy() const {
  std::lock_guard<std::mutex> lock(mu_);
  Occupancy o;
  for (const auto& slot : slots_) {
    o.idle += slot->load == 0 ? 1 : 0;
    o.has_room |= slot->load < kBatchesPerDevice;
  }
  return o;
}

std::shared_ptr<void> DevicePool::MapHostMemory(const void* data, int64_t bytes) {
  auto mappings = std::make_shared<std::vector<std::shared_ptr<void>>>();
  for (const std::unique_ptr<Slot>& slot : slots_) {
    std::shared_ptr<void> mapping = slot->device->MapHostMemory(data, bytes);
    if (mapping == nullptr) return nullptr;  // those made so far end here
    mappings->push_back(std::move(mapping));
  }
  if (mappings->empty()) return nullptr;
  return mappings;
}

void DevicePool::Submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    int best = 0;
    for (int i = 1; i < size(); ++i) {
      if (slots_[i]->load < slots_[best]->load) best = i;
    }
    ++slots_[best]->load;
    slots_[best]->queue.push_back(std::move(job));
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
    slot.running = true;
    if (lend_idle_cpus_) Relend(index);
    lock.unlock();
    std::move(job)(*slot.device, index);
    lock.lock();
    --slot.load;
    slot.running = false;
    if (lend_idle_cpus_) Relend(-1);
    lock.unlock();
    if (on_capacity_) on_capacity_();
    lock.lock();
  }
}

void DevicePool::Relend(int started) {
  int idle_threads = 0, running = 0;
  for (const auto& slot : slots_) {
    if (slot->load == 0) idle_threads += slot->device->info().host_threads;
    running += slot->running ? 1 : 0;
  }
  int k = 0;
  for (int i = 0; i < size(); ++i) {
    Slot& slot = *slots_[i];
    if (!slot.running) continue;
    const int share = idle_threads / running + (k++ < idle_threads % running ? 1 : 0);
    if (share == slot.lent && i != started) continue;
    slot.lent = share;
    slot.device->LendCpus(share);  // thread-safe, and takes no lock of ours
  }
}

}  // namespace mlaserve::engine
