#ifndef MLASERVE_KERNELS_NPU_GLOBAL_MEMORY_H_
#define MLASERVE_KERNELS_NPU_GLOBAL_MEMORY_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlaserve::npu {

// A range of device global memory (HBM). `host` is where the bytes live on the host, or
// null for allocations made only to model a launch's addresses and traffic.
struct GmBuffer {
  uint64_t addr = 0;
  int64_t bytes = 0;
  std::byte* host = nullptr;

  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(host);
  }
  GmBuffer Slice(int64_t offset, int64_t length) const {
    return GmBuffer{addr + static_cast<uint64_t>(offset), length,
                    host == nullptr ? nullptr : host + offset};
  }
};

// The footprint of one DMA in GM: `rows` runs of `row_bytes`, `stride` bytes apart (Ascend
// C's DataCopyParams: blockCount, blockLen, srcStride). The L2 model and the atomic guards
// see exactly these bytes.
struct GmRegion {
  uint64_t addr = 0;
  int64_t rows = 1;
  int64_t row_bytes = 0;
  int64_t stride = 0;

  int64_t bytes() const { return rows * row_bytes; }
  int64_t span() const { return rows == 0 ? 0 : (rows - 1) * stride + row_bytes; }

  static GmRegion Whole(const GmBuffer& b) { return {b.addr, 1, b.bytes, b.bytes}; }
  // `rows` runs of `row_bytes` starting `offset` bytes into `base`, `stride` bytes apart.
  static GmRegion Rows(const GmBuffer& base, int64_t offset, int64_t rows, int64_t row_bytes,
                       int64_t stride) {
    return {base.addr + static_cast<uint64_t>(offset), rows, row_bytes, stride};
  }
};

// The device's HBM: an address space with a capacity, holding emulator-owned allocations
// (workspaces, outputs) and host memory mapped in (the KV pool lives in the engine's memory
// and is mapped, not copied). Thread-safe.
//
// The host backing of a released allocation is kept for a later allocation of about the
// same size: serving allocates the same workspaces batch after batch, and fresh host memory
// costs a page fault per page on first touch and an munmap on release. At most as many
// bytes are kept as were ever live at once, so the host footprint stays within twice the
// peak.
class GlobalMemory {
 public:
  GlobalMemory(int64_t capacity, int64_t alignment);

  // `backed` = false reserves addresses only (model-only launches of paper-sized shapes).
  // The host bytes of a backed allocation are indeterminate, as on the device: they may be
  // an earlier buffer's.
  absl::StatusOr<GmBuffer> Allocate(int64_t bytes, bool backed, absl::string_view what);
  // Gives existing host memory a device address; it counts against the capacity.
  absl::StatusOr<GmBuffer> Map(void* host, int64_t bytes, absl::string_view what);
  // Returns the range to the free list (and an allocation's host backing to the spares).
  void Release(const GmBuffer& buffer);

  // Checks accesses (a launch's every DMA): OK if [addr, addr + span) lies inside one live
  // buffer (its requested size, not the aligned reservation); otherwise says which buffer it
  // overruns, or that it hits none. Takes the lock once for all of them, and an access inside
  // the buffer the previous one hit needs no lookup. Nothing may be allocated or released on
  // this thread while it lives.
  class AccessChecker {
   public:
    explicit AccessChecker(const GlobalMemory& gm) : gm_(gm), lock_(gm.mu_) {}
    absl::Status Check(uint64_t addr, int64_t span);

   private:
    const GlobalMemory& gm_;
    std::lock_guard<std::mutex> lock_;
    uint64_t begin_ = 0, end_ = 0;  // the buffer the last access hit; empty at first
  };

  int64_t used() const;
  int64_t capacity() const { return capacity_; }
  // Host bytes of released allocations kept for reuse.
  int64_t spare_host_bytes() const;

  // Atomic read-modify-writes into GM from different cores may overlap (that is what
  // atomics are for): the emulator serialises them per 16 KiB stripe of address space.
  class AtomicGuard {
   public:
    AtomicGuard(GlobalMemory& gm, uint64_t addr, int64_t bytes);
    ~AtomicGuard();
    AtomicGuard(const AtomicGuard&) = delete;
    AtomicGuard& operator=(const AtomicGuard&) = delete;

   private:
    // The stripes an access covers are consecutive modulo kStripes: at most two runs,
    // locked in ascending order, so guards never deadlock. No allocation: a guard is taken
    // for every atomic write.
    GlobalMemory& gm_;
    int first_lo_ = 0, first_hi_ = -1;    // [lo, hi] of the run starting at stripe 0
    int second_lo_ = 0, second_hi_ = -1;  // the other run, above the first
  };

 private:
  absl::StatusOr<uint64_t> Reserve(int64_t bytes, absl::string_view what);  // holds mu_
  absl::Status CheckAccessLocked(uint64_t addr, int64_t span, uint64_t* begin,
                                 uint64_t* end) const;  // holds mu_

  static constexpr int kStripes = 1024;
  static constexpr int kStripeShift = 14;  // 16 KiB

  const int64_t capacity_;
  const int64_t alignment_;
  // std::mutex, not absl::Mutex: Debian's abseil is not built for ThreadSanitizer, whose
  // reports then drown in abseil's own deadlock-detection bookkeeping. Guards all below.
  mutable std::mutex mu_;
  std::map<uint64_t, int64_t> free_;  // addr -> size, coalesced
  struct Live {
    int64_t reserved = 0;  // aligned size taken from the free list
    int64_t bytes = 0;     // size asked for
    std::string what;
  };
  std::map<uint64_t, Live> live_;  // by address
  struct Backing {
    std::unique_ptr<std::byte[]> host;
    int64_t bytes = 0;  // may exceed the buffer's size when reused
  };
  absl::flat_hash_map<uint64_t, Backing> owned_;  // by device address
  int64_t owned_bytes_ = 0;                       // host bytes of the live allocations
  int64_t peak_owned_bytes_ = 0;                  // the most that were ever live at once
  struct Spare {
    uint64_t released = 0;  // release order: the oldest spare goes first
    std::unique_ptr<std::byte[]> host;
  };
  std::multimap<int64_t, Spare> spares_;  // by host bytes
  int64_t spare_bytes_ = 0;
  uint64_t releases_ = 0;
  int64_t used_ = 0;
  std::array<std::mutex, kStripes> stripes_;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_GLOBAL_MEMORY_H_
