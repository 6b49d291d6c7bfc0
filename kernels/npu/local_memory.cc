#include "kernels/npu/local_memory.h"

#include "absl/strings/str_cat.h"

namespace mlaserve::npu {

absl::string_view SpaceName(Space space) {
  switch (space) {
    case Space::kL1:
      return "L1";
    case Space::kL0A:
      return "L0A";
    case Space::kL0B:
      return "L0B";
    case Space::kL0C:
      return "L0C";
    case Space::kUb:
      return "UB";
  }
  return "?";
}

LocalArena::LocalArena(Space space, int64_t capacity, int64_t alignment, std::byte* host_base)
    : space_(space), capacity_(capacity), alignment_(alignment), host_base_(host_base) {}

absl::StatusOr<LocalTensor> LocalArena::Allocate(int64_t bytes, absl::string_view what) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(SpaceName(space_), " buffer '", what, "' has non-positive size ", bytes));
  }
  const int64_t offset = (used_ + alignment_ - 1) / alignment_ * alignment_;
  const int64_t size = (bytes + alignment_ - 1) / alignment_ * alignment_;
  if (offset + size > capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(SpaceName(space_), " overflow: buffer '", what, "' needs ", bytes, " B (",
                     size, " B aligned to ", alignment_, ") at offset ", offset,
                     " but the space holds ", capacity_, " B"));
  }
  used_ = offset + size;
  LocalTensor t;
  t.space = space_;
  t.offset = offset;
  t.bytes = bytes;
  t.host = host_base_ == nullptr || HostScale(space_) == 0
               ? nullptr
               : host_base_ + offset * HostScale(space_);
  return t;
}

LocalMemoryStorage::LocalMemoryStorage(const DeviceProfile& profile)
    : cores_(new CoreStorage[profile.cube_cores + profile.vector_cores()]) {
  for (int c = 0; c < profile.cube_cores; ++c) {
    cores_[c].l1.reset(new std::byte[profile.l1_bytes * HostScale(Space::kL1)]);
    cores_[c].l0c.reset(new std::byte[profile.l0c_bytes * HostScale(Space::kL0C)]);
  }
  for (int v = 0; v < profile.vector_cores(); ++v) {
    cores_[profile.cube_cores + v].ub.reset(new std::byte[profile.ub_bytes]);
  }
}

std::byte* LocalMemoryStorage::Base(int core, Space space) const {
  const CoreStorage& s = cores_[core];
  switch (space) {
    case Space::kL1:
      return s.l1.get();
    case Space::kL0A:
    case Space::kL0B:
      return nullptr;
    case Space::kL0C:
      return s.l0c.get();
    case Space::kUb:
      return s.ub.get();
  }
  return nullptr;
}

}  // namespace mlaserve::npu
