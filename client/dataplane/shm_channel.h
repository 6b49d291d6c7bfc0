#ifndef MLASERVE_CLIENT_DATAPLANE_SHM_CHANNEL_H_
#define MLASERVE_CLIENT_DATAPLANE_SHM_CHANNEL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/dataplane/region_arrays.h"
#include "client/decode_batch.h"
#include "common/shm_layout.h"
#include "mlaserve/v1/data_plane.pb.h"

namespace mlaserve::client {

struct ShmChannelOptions {
  // The region registered with the server, shared by `slots` calls at a time (each slot's
  // share holds one call's queries, rows and answers: 16 MiB each by default, a 72-sequence
  // head-space call takes 6). Its pages are touched only as calls use them.
  uint64_t region_bytes = uint64_t{512} << 20;
  uint32_t slots = 32;
  // How long a caller spins around when its answer is due (from what recent calls took)
  // before it sleeps on a futex until the server wakes it.
  absl::Duration spin = absl::Microseconds(100);
  // The region's tail kept for arrays callers allocate there (AllocateArray); the slots
  // share the rest. 0: none.
  uint64_t array_bytes = uint64_t{128} << 20;
};

// The client's side of the same-host data plane: a memfd region registered once with the
// server's unix socket, then each packed Decode written into a free slot's share of it and
// answered there (docs/api.md, "Data planes"). Thread-safe: up to `slots` calls at once,
// more wait for a slot.
class ShmChannel : public std::enable_shared_from_this<ShmChannel> {
 public:
  // Registers a new region with the plane OpenDataPlane answered (its ticket spent here).
  // The server's refusal as it gives it (FAILED_PRECONDITION for another version, ...).
  static absl::StatusOr<std::unique_ptr<ShmChannel>> Open(const v1::OpenDataPlaneResponse& opened,
                                                          ShmChannelOptions options = {});
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // One packed call within `timeout`, answered into `output` (CheckDecodeBatch's and the
  // server's statuses as over gRPC). FAILED_PRECONDITION if the call does not fit a slot
  // (the caller sends it over gRPC instead); UNAVAILABLE once the server has closed the
  // plane (a restart: open another).
  absl::Status Decode(const DecodeBatchRequest& request, DecodeBatchOutput& output,
                      absl::Duration timeout);

  // A block of the region's array area (64-byte aligned; the channel stays open while the
  // array lives), or nullopt when the area has no room. A call's tensors and answer buffers
  // that lie in it are named by offset, neither copied into the slot nor out of it: the
  // server reads the queries and writes the answers there. A call that ends without its
  // answer (DEADLINE_EXCEEDED, UNAVAILABLE) may still be answered there later: the channel
  // never hands those answer blocks out again, and the caller should not reuse them either.
  // The channel must be held by a shared_ptr.
  std::optional<SharedArray> AllocateArray(uint64_t bytes);

  // Whether the call fits a slot's share of the region (with room to spare: Decode may still
  // find it does not).
  bool Fits(const DecodeBatchRequest& request, const DecodeBatchOutput& output) const;
  bool broken() const;
  const std::string& instance_id() const { return instance_id_; }
  uint64_t slot_bytes() const { return slot_bytes_; }

 private:
  ShmChannel(int socket, uint8_t* base, ShmChannelOptions options, std::string instance_id);
  shm::RegionHeader& header() const { return *reinterpret_cast<shm::RegionHeader*>(base_); }
  shm::Slot& slot(uint32_t i) const {
    return reinterpret_cast<shm::Slot*>(base_ + shm::kSlotsOffset)[i];
  }
  absl::StatusOr<uint32_t> AcquireSlot(absl::Time deadline);
  void ReleaseSlot(uint32_t slot);
  // Waits for the slot's answer: OK, DEADLINE_EXCEEDED or UNAVAILABLE (the server is gone).
  absl::Status AwaitAnswer(uint32_t slot, absl::Time deadline);
  void Ring(uint32_t slot);
  void MarkBroken();
  // The region's offset of [data, data + bytes) when it lies in the array area.
  std::optional<uint64_t> ArrayOffset(const void* data, uint64_t bytes) const;

  const int socket_;
  uint8_t* const base_;
  const ShmChannelOptions options_;
  const std::string instance_id_;
  const uint64_t slot_bytes_;
  RegionArrays arrays_;
  mutable std::mutex mu_;
  std::condition_variable slot_freed_;
  std::vector<uint32_t> free_slots_;  // guarded by mu_
  bool broken_ = false;               // guarded by mu_
  // What calls have recently taken to answer, for when to spin (AwaitAnswer).
  std::atomic<int64_t> expected_ns_{0};
};

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_DATAPLANE_SHM_CHANNEL_H_
