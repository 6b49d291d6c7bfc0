#ifndef MLASERVE_SERVER_DATAPLANE_MAPPED_REGION_H_
#define MLASERVE_SERVER_DATAPLANE_MAPPED_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/shm_layout.h"

namespace mlaserve::dataplane {

// A client's registered region (common/shm_layout.h) mapped into the server. The client keeps
// writing to it at will, so the server reads a field once and checks it; every offset it
// uses is checked here against the region, and the answers may only go to the data area.
class MappedRegion {
 public:
  // Takes `fd` (closed here whatever happens). The fd must be a memfd sealed against
  // shrinking (F_SEAL_SHRINK: a truncated page would fault the server), at most `max_bytes`
  // long, with a header of this version. INVALID_ARGUMENT naming what is wrong;
  // FAILED_PRECONDITION for another layout version (naming both); RESOURCE_EXHAUSTED past
  // `max_bytes`.
  static absl::StatusOr<std::unique_ptr<MappedRegion>> Map(int fd, uint64_t max_bytes);
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  uint64_t bytes() const { return bytes_; }
  // The whole mapping (header, slots, data area).
  const uint8_t* base() const { return base_; }
  uint32_t slot_count() const { return slot_count_; }
  shm::RegionHeader& header() const { return *reinterpret_cast<shm::RegionHeader*>(base_); }
  shm::Slot& slot(uint32_t index) const {
    return reinterpret_cast<shm::Slot*>(base_ + shm::kSlotsOffset)[index];
  }

  // [offset, offset + size) of the data area, or INVALID_ARGUMENT naming `field` (and the
  // area) when it lies elsewhere or overflows.
  absl::StatusOr<uint8_t*> Data(uint64_t offset, uint64_t size, absl::string_view field) const;

 private:
  MappedRegion(uint8_t* base, uint64_t bytes, uint32_t slot_count)
      : base_(base), bytes_(bytes), slot_count_(slot_count) {}

  uint8_t* const base_;
  const uint64_t bytes_;
  uint32_t slot_count_;  // set once the header is checked
};

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_MAPPED_REGION_H_
