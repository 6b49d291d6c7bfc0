#ifndef MLASERVE_KERNELS_NPU_L2_CACHE_MODEL_H_
#define MLASERVE_KERNELS_NPU_L2_CACHE_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kernels/npu/global_memory.h"

namespace mlaserve::npu {

// Which global-memory bytes are resident in L2, line by line. A line counts as resident if
// fewer than `capacity` bytes of GM traffic have passed since it was last touched: LRU with
// the reuse distance measured in bytes moved rather than distinct bytes, which errs towards
// misses when the same lines are touched repeatedly. Reads that hit are served at L2
// bandwidth; misses also consume HBM bandwidth. Writes allocate (write-back; write costs are
// not charged to HBM). Deterministic: the timing model feeds accesses in simulated-time order.
//
// Precisely, for every row of a region in order, and every line the row's bytes [lo, hi)
// touch in address order: the line hits if it was touched before and the clock has advanced
// by less than `capacity` since; a hit counts the bytes of the line inside [lo, hi), a miss
// fetches the whole line. Either way the line's last touch becomes the clock, and then the
// clock advances by those bytes.
class L2CacheModel {
 public:
  L2CacheModel(int64_t capacity_bytes, int64_t line_bytes) { Reset(capacity_bytes, line_bytes); }

  // As newly constructed, but keeping the storage grown so far: a device's timing model reuses
  // one model from launch to launch instead of allocating and page-faulting its arrays again.
  void Reset(int64_t capacity_bytes, int64_t line_bytes);

  struct Outcome {
    int64_t hit_bytes = 0;      // requested bytes already resident
    int64_t fetched_bytes = 0;  // whole lines brought in from HBM for the rest
  };
  // Looks the region up, then makes all its lines resident.
  Outcome Access(const GmRegion& region);

 private:
  // Lines are tracked in blocks of consecutive lines (64 KiB of GM with 512-byte lines), so
  // a DMA walks one block's array instead of hashing every line.
  static constexpr int kBlockShift = 7;
  static constexpr uint64_t kLinesPerBlock = uint64_t{1} << kBlockShift;

  // The last-touch stamps of `block`'s lines, created as never touched on first use. Valid
  // until the next call (the storage may grow).
  uint64_t* Lines(uint64_t block) {
    if (block != cached_block_) Look(block);
    return stamps_.data() + cached_offset_;
  }
  void Look(uint64_t block);  // points the cache at `block`

  uint64_t capacity_ = 0;
  uint64_t line_bytes_ = 1;
  // log2 of the line size when it is a power of two (every shipped profile), else -1: a
  // shift instead of a 64-bit division per row, which was a fifth of the model's time.
  int line_shift_ = 0;
  // A stamp no touch can have produced: the clock minus it is at least `capacity_` for
  // every clock value, so a never-touched line needs no separate check to miss.
  uint64_t never_ = 0;
  uint64_t traffic_ = 0;                               // bytes accessed so far: the model's clock
  absl::flat_hash_map<uint64_t, uint32_t> directory_;  // block -> its index in stamps_
  std::vector<uint64_t> stamps_;                       // kLinesPerBlock last-touch stamps per block
  // The most recent block, which a DMA's next line is almost always in.
  uint64_t cached_block_ = UINT64_MAX;
  size_t cached_offset_ = 0;  // of its stamps in stamps_
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_L2_CACHE_MODEL_H_
