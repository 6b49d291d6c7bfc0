#ifndef MLASERVE_COMMON_SHM_LAYOUT_H_
#define MLASERVE_COMMON_SHM_LAYOUT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mlaserve::shm {

// The same-host data plane's shared memory (docs/api.md, "Data planes"): one region a client
// creates (a memfd sealed against shrinking), registers once over the server's unix socket,
// and then calls through by slot. Both sides map it; the client owns it. Every field the
// client writes is read by the server once, checked, and never trusted again; the server
// writes only a slot's answer fields and the answers' bytes where the call asked.
//
//   [0, 256)                         RegionHeader
//   [256, 256 + 128 slots)           Slot[slot_count]
//   [data_offset, region_bytes)      the client's: calls, tensors, answers

inline constexpr uint32_t kShmVersion = 1;
inline constexpr char kShmMagic[8] = {'M', 'L', 'A', 'S', 'H', 'M', '1', '\0'};
inline constexpr uint32_t kMaxSlots = 256;

// A slot's life. The client may reuse a slot once it is kDone (reading the answer first).
enum SlotState : uint32_t {
  kIdle = 0,
  kSubmitted = 1,  // the client published a call: the doorbell
  kTaken = 2,      // the server copied it out and runs it
  kDone = 3,       // the answer is written
};

struct alignas(64) RegionHeader {
  char magic[8];
  uint32_t version;
  uint32_t slot_count;
  uint64_t region_bytes;
  uint64_t slots_offset;
  uint64_t data_offset;
  alignas(64) std::atomic<uint32_t> server_sleeping;  // 1: ring the socket after submitting
  char reserved[256 - 64 - sizeof(std::atomic<uint32_t>)];
};
static_assert(sizeof(RegionHeader) == 256);

struct alignas(64) Slot {
  // The futex word both sides wait on.
  std::atomic<uint32_t> state;
  // The client sets it before a futex wait; the server wakes the slot only then.
  std::atomic<uint32_t> client_waiting;
  // The client sets it to abandon the call (deadline passed on its side).
  std::atomic<uint32_t> cancel;
  std::atomic<uint32_t> call_bytes;
  // A serialized DataPlaneCall at call_offset.
  std::atomic<uint64_t> call_offset;
  // Where the server writes the serialized DataPlaneAnswer, and the room there.
  std::atomic<uint64_t> answer_offset;
  std::atomic<uint64_t> answer_capacity;
  // Written by the server before kDone: the answer's size (0 when none could be written
  // there) and its status code (a grpc code, 0 = OK).
  std::atomic<uint64_t> answer_bytes;
  std::atomic<int32_t> status_code;
  char reserved[128 - 52];
};
static_assert(sizeof(Slot) == 128);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

inline constexpr uint64_t kSlotsOffset = sizeof(RegionHeader);
inline constexpr uint64_t DataOffset(uint32_t slot_count) {
  return kSlotsOffset + uint64_t{slot_count} * sizeof(Slot);
}

}  // namespace mlaserve::shm

#endif  // MLASERVE_COMMON_SHM_LAYOUT_H_
