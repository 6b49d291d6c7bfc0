#ifndef MLASERVE_KERNELS_GPU_HOST_MAPPINGS_H_
#define MLASERVE_KERNELS_GPU_HOST_MAPPINGS_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace mlaserve::gpu {

// The host ranges a GPU reads in place (GpuRuntime::MapHost): registered from any thread
// (a data plane's, as clients come and go), looked up by the device's thread as it lowers a
// batch. Thread-safe.
class HostMappings : public std::enable_shared_from_this<HostMappings> {
 public:
  HostMappings() = default;
  HostMappings(const HostMappings&) = delete;
  HostMappings& operator=(const HostMappings&) = delete;

  // Records [data, data + bytes); the range is forgotten, then `release` runs, when the last
  // copy of the handle goes (which keeps this object alive). Held by a shared_ptr.
  std::shared_ptr<void> Add(const void* data, int64_t bytes, absl::AnyInvocable<void()> release);

  // Whether [data, data + bytes) lies within one recorded range.
  bool Contains(const void* data, int64_t bytes) const;

 private:
  void Remove(uintptr_t begin);

  mutable absl::Mutex mu_;
  std::map<uintptr_t, uintptr_t> ranges_ ABSL_GUARDED_BY(mu_);  // begin -> end
};

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_HOST_MAPPINGS_H_
