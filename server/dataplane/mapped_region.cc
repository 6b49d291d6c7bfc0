#include "server/dataplane/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace mlaserve::dataplane {
namespace {

absl::Status Invalid(absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("region: ", problem));
}

struct ClosesFd {
  int fd;
  ~ClosesFd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::Map(int fd, uint64_t max_bytes) {
  ClosesFd closes{fd};
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return Invalid("not a memfd (memfd_create with MFD_ALLOW_SEALING)");
  if ((seals & F_SEAL_SHRINK) == 0) {
    return Invalid(
        "not sealed against shrinking (F_SEAL_SHRINK): a truncated page would fault "
        "the server");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) return Invalid(absl::StrCat("fstat: ", std::strerror(errno)));
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes < shm::DataOffset(1)) {
    return Invalid(absl::StrCat(bytes, " bytes hold no header and slot"));
  }
  if (bytes > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "region: ", bytes, " bytes exceed the ", max_bytes,
        " a client may register (--data_plane_region_mb, or the tenant's or server's total)"));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return Invalid(absl::StrCat("mmap: ", std::strerror(errno)));
  // Owned from here, unmapped by the destructor on any refusal below.
  std::unique_ptr<MappedRegion> region(
      new MappedRegion(static_cast<uint8_t*>(base), bytes, /*slot_count=*/0));
  // One read of the header into private memory: the client may rewrite it meanwhile.
  shm::RegionHeader header;
  std::memcpy(static_cast<void*>(&header), base, offsetof(shm::RegionHeader, server_sleeping));
  if (std::memcmp(header.magic, shm::kShmMagic, sizeof(header.magic)) != 0) {
    return Invalid("its header does not start with the magic \"MLASHM1\"");
  }
  if (header.version != shm::kShmVersion) {
    return absl::FailedPreconditionError(absl::StrCat("region: layout version ", header.version,
                                                      "; this server speaks version ",
                                                      shm::kShmVersion));
  }
  if (header.slot_count < 1 || header.slot_count > shm::kMaxSlots) {
    return Invalid(
        absl::StrCat("slot_count ", header.slot_count, " is outside [1, ", shm::kMaxSlots, "]"));
  }
  if (header.region_bytes != bytes || header.slots_offset != shm::kSlotsOffset ||
      header.data_offset != shm::DataOffset(header.slot_count) || header.data_offset > bytes) {
    return Invalid(absl::StrCat("header says ", header.region_bytes, " bytes, slots at ",
                                header.slots_offset, ", data at ", header.data_offset,
                                "; the memfd has ", bytes, " bytes and ", header.slot_count,
                                " slots put data at ", shm::DataOffset(header.slot_count)));
  }
  region->slot_count_ = header.slot_count;
  return region;
}

MappedRegion::~MappedRegion() { munmap(base_, bytes_); }

absl::StatusOr<uint8_t*> MappedRegion::Data(uint64_t offset, uint64_t size,
                                            absl::string_view field) const {
  const uint64_t first = shm::DataOffset(slot_count_);
  if (offset < first || offset > bytes_ || size > bytes_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": [", offset, ", ", offset, " + ", size,
                                                   ") is outside the region's data area [", first,
                                                   ", ", bytes_, ")"));
  }
  return base_ + offset;
}

}  // namespace mlaserve::dataplane
