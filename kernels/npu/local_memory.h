#ifndef MLASERVE_KERNELS_NPU_LOCAL_MEMORY_H_
#define MLASERVE_KERNELS_NPU_LOCAL_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/npu/device_profile.h"

namespace mlaserve::npu {

// Core-local buffers. Capacity and alignment are the device's (from the profile) and an
// allocation that does not fit is a kernel bug reported with the buffer's name.
enum class Space : uint8_t { kL1, kL0A, kL0B, kL0C, kUb };

absl::string_view SpaceName(Space space);

// A region of one core's local memory. `bytes` is what the device holds, and L1, L0C and UB
// store exactly that on the host. The MMAD reads its operands straight out of L1, so L0A/L0B
// have no host copy at all (staging them would change no bit and cost a copy per tile);
// their capacity, alignment and MTE1 time are still enforced and modelled.
struct LocalTensor {
  Space space = Space::kUb;
  int64_t offset = 0;
  int64_t bytes = 0;
  void* host = nullptr;  // null when the launch only models time, and always for L0A/L0B

  template <typename T>
  T* as() const {
    return static_cast<T*>(host);
  }
};

// Host bytes per device byte in a space.
constexpr int HostScale(Space space) {
  switch (space) {
    case Space::kL0A:
    case Space::kL0B:
      return 0;
    case Space::kL1:
    case Space::kL0C:
    case Space::kUb:
      return 1;
  }
  return 1;
}

// The bump allocator of one space of one core (Ascend C's TPipe::InitBuffer carves buffers
// the same way, once, at kernel start).
class LocalArena {
 public:
  LocalArena(Space space, int64_t capacity, int64_t alignment, std::byte* host_base);

  absl::StatusOr<LocalTensor> Allocate(int64_t bytes, absl::string_view what);
  void Reset() { used_ = 0; }
  int64_t used() const { return used_; }
  int64_t capacity() const { return capacity_; }

 private:
  Space space_;
  int64_t capacity_;
  int64_t alignment_;
  std::byte* host_base_;
  int64_t used_ = 0;
};

// The host backing of every core's local memory, allocated once per device.
class LocalMemoryStorage {
 public:
  explicit LocalMemoryStorage(const DeviceProfile& profile);
  std::byte* Base(int core, Space space) const;  // core: global index, AICs first

 private:
  struct CoreStorage {
    std::unique_ptr<std::byte[]> l1, l0c, ub;
  };
  std::unique_ptr<CoreStorage[]> cores_;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_LOCAL_MEMORY_H_
