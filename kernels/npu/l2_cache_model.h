#ifndef MLASERVE_KERNELS_NPU_L2_CACHE_MODEL_H_
#define MLASERVE_KERNELS_NPU_L2_CACHE_MODEL_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "kernels/npu/global_memory.h"

namespace mlaserve::npu {

// Which global-memory bytes are resident in L2, line by line. A line counts as resident if
// fewer than `capacity` bytes of GM traffic have passed since it was last touched: LRU with
// the reuse distance measured in bytes moved rather than distinct bytes, which errs towards
// misses when the same lines are touched repeatedly. Reads that hit are served at L2
// bandwidth; misses also consume HBM bandwidth. Writes allocate (write-back; write costs are
// not charged to HBM). Deterministic: the timing model feeds accesses in simulated-time order.
class L2CacheModel {
 public:
  L2CacheModel(int64_t capacity_bytes, int64_t line_bytes);

  struct Outcome {
    int64_t hit_bytes = 0;      // requested bytes already resident
    int64_t fetched_bytes = 0;  // whole lines brought in from HBM for the rest
  };
  // Looks the region up, then makes all its lines resident.
  Outcome Access(const GmRegion& region);

 private:
  int64_t capacity_;
  int64_t line_bytes_;
  uint64_t traffic_ = 0;  // bytes accessed so far: the model's clock
  absl::flat_hash_map<uint64_t, uint64_t> last_touch_;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_L2_CACHE_MODEL_H_
