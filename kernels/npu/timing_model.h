#ifndef MLASERVE_KERNELS_NPU_TIMING_MODEL_H_
#define MLASERVE_KERNELS_NPU_TIMING_MODEL_H_

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/npu/device_profile.h"
#include "kernels/npu/pipe.h"
#include "kernels/npu/program.h"

namespace mlaserve::npu {

// The modelled duration of a launch and where its cycles went.
struct LaunchTiming {
  int64_t total_cycles = 0;   // launch overhead + last completion
  // Busy (occupied) cycles summed over all cores, per pipe, separately for AIC and AIV.
  std::array<int64_t, kNumPipes> cube_busy{};
  std::array<int64_t, kNumPipes> vector_busy{};
  int64_t gm_read_bytes = 0;
  int64_t hbm_read_bytes = 0;  // the part of the reads that missed L2
  int64_t gm_write_bytes = 0;
  int64_t instructions = 0;
};

// Discrete-event simulation of a finalized program. Every pipe is an in-order queue; an
// instruction starts when its pipe is free and its flags have fired; GM traffic queues on
// the die's shared L2 and HBM bandwidth (first come, first served in simulated time), with
// L2 residency from an LRU model. Deterministic for a given program and profile.
//
// Fails, instead of hanging, when the flags form a cycle (a deadlock) and when two sets of
// one intra-core flag are outstanding at once (illegal on A2/A3), or a cross-core counter
// would exceed its 16 outstanding sets.
absl::StatusOr<LaunchTiming> SimulateLaunch(const Program& program, const DeviceProfile& profile);

// SimulateLaunch's per-instruction working memory. A device keeps one and passes it to
// every launch, so the arrays are neither allocated nor page-faulted again each time; they
// keep the size of the largest launch so far. Holds nothing between calls but capacity.
class TimingScratch {
 private:
  friend absl::StatusOr<LaunchTiming> SimulateLaunch(const Program& program,
                                                     const DeviceProfile& profile,
                                                     TimingScratch& scratch);
  struct Node {
    double ready;      // when every predecessor allows it to start
    uint32_t pending;  // predecessors not yet simulated
  };
  std::vector<Node> nodes_;
  // Per instruction: completion of a set, start of a wait (what the flag checks compare).
  std::vector<double> marks_;
  std::vector<double> pipe_done_;
  std::vector<std::pair<double, uint32_t>> queue_;  // a min-heap on (ready time, id)
};

// The same, with the caller's working memory.
absl::StatusOr<LaunchTiming> SimulateLaunch(const Program& program, const DeviceProfile& profile,
                                            TimingScratch& scratch);

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_TIMING_MODEL_H_
