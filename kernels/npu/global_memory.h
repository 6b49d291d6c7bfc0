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
class GlobalMemory {
 public:
  GlobalMemory(int64_t capacity, int64_t alignment);

  // `backed` = false reserves addresses only (model-only launches of paper-sized shapes).
  absl::StatusOr<GmBuffer> Allocate(int64_t bytes, bool backed, absl::string_view what);
  // Gives existing host memory a device address; it counts against the capacity.
  absl::StatusOr<GmBuffer> Map(void* host, int64_t bytes, absl::string_view what);
  // Returns the range to the free list (and drops the host backing of an allocation).
  void Release(const GmBuffer& buffer);

  // OK if [addr, addr + span) lies inside one live buffer (its requested size, not the
  // aligned reservation); otherwise says which buffer it overruns, or that it hits none.
  absl::Status CheckAccess(uint64_t addr, int64_t span) const;

  int64_t used() const;
  int64_t capacity() const { return capacity_; }

  // Atomic read-modify-writes into GM from different cores may overlap (that is what
  // atomics are for): the emulator serialises them per 16 KiB stripe of address space.
  class AtomicGuard {
   public:
    AtomicGuard(GlobalMemory& gm, uint64_t addr, int64_t bytes);
    ~AtomicGuard();
    AtomicGuard(const AtomicGuard&) = delete;
    AtomicGuard& operator=(const AtomicGuard&) = delete;

   private:
    std::vector<std::mutex*> locked_;
  };

 private:
  absl::StatusOr<uint64_t> Reserve(int64_t bytes, absl::string_view what);  // holds mu_

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
  absl::flat_hash_map<uint64_t, std::unique_ptr<std::byte[]>> owned_;
  int64_t used_ = 0;
  std::array<std::mutex, kStripes> stripes_;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_GLOBAL_MEMORY_H_
