#include "kernels/gpu/host_mappings.h"

#include <utility>

namespace mlaserve::gpu {

std::shared_ptr<void> HostMappings::Add(const void* data, int64_t bytes,
                                        absl::AnyInvocable<void()> release) {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  {
    absl::MutexLock lock(&mu_);
    ranges_[begin] = begin + static_cast<uintptr_t>(bytes);
  }
  // The handle points at the mapped bytes; deleting it forgets the range before the memory
  // may be unpinned, so no lowering that starts after picks it.
  return std::shared_ptr<void>(
      const_cast<void*>(data),
      [self = shared_from_this(), begin, release = std::move(release)](void*) mutable {
        self->Remove(begin);
        release();
      });
}

void HostMappings::Remove(uintptr_t begin) {
  absl::MutexLock lock(&mu_);
  ranges_.erase(begin);
}

bool HostMappings::Contains(const void* data, int64_t bytes) const {
  if (bytes < 0) return false;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  absl::MutexLock lock(&mu_);
  auto it = ranges_.upper_bound(begin);
  if (it == ranges_.begin()) return false;
  --it;
  return begin >= it->first && begin + static_cast<uintptr_t>(bytes) <= it->second;
}

}  // namespace mlaserve::gpu
