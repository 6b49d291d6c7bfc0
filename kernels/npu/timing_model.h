#ifndef MLASERVE_KERNELS_NPU_TIMING_MODEL_H_
#define MLASERVE_KERNELS_NPU_TIMING_MODEL_H_

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/npu/device_profile.h"
#include "kernels/npu/l2_cache_model.h"
#include "kernels/npu/pipe.h"
#include "kernels/npu/program.h"

namespace mlaserve::npu {

// The modelled duration of a launch and where its cycles went.
struct LaunchTiming {
  int64_t total_cycles = 0;  // head + last completion
  int64_t head_cycles = 0;   // LaunchHeadCycles: starting the launch's cores
  // Busy (occupied) cycles summed over all cores, per pipe, separately for AIC and AIV.
  std::array<int64_t, kNumPipes> cube_busy{};
  std::array<int64_t, kNumPipes> vector_busy{};
  int64_t gm_read_bytes = 0;
  int64_t hbm_read_bytes = 0;  // the part of the reads that missed L2
  int64_t gm_write_bytes = 0;
  int64_t instructions = 0;
};

// The device-side head of a launch, added to the simulated time: launch_overhead_cycles plus
// mix_block_start_cycles per block for a MIX launch (AIC and AIV work), plus
// cube_block_start_cycles per block for an AIC-only one; vector_launch_overhead_cycles plus
// vector_block_start_cycles per AIV for an AIV-only one; blocks counted per die (each die's
// scheduler starts its own); plus core_prologue_cycles. Huawei documents the head growing
// linearly with the cores started (profiles/*.json cite the figures).
int64_t LaunchHeadCycles(const DeviceProfile& profile, int block_dim, bool uses_cube,
                         bool uses_vector);

// SimulateLaunch's per-instruction working memory. A device keeps one and passes it to
// every launch, so the arrays are neither allocated nor page-faulted again each time; they
// keep the size of the largest launch so far. Holds nothing between calls but capacity.
class TimingScratch {
 private:
  friend absl::StatusOr<LaunchTiming> SimulateLaunch(const Program& program,
                                                     const DeviceProfile& profile,
                                                     TimingScratch& scratch);
  // What the simulation reads and writes of one instruction, in one place: a copy of the
  // Instruction's timing fields in 48 bytes instead of 80 plus separate state arrays, so
  // the pops, which hop between the cores' instruction streams, touch fewer cache lines.
  struct Node {
    // Until simulated, when its predecessors allow it to start; then what the flag checks
    // compare: a set's completion, any other instruction's start.
    double time;
    double cycles;
    double latency;
    uint32_t pending;     // predecessors not yet simulated
    uint32_t first_edge;  // its out-edges: edges()[first_edge, first_edge + edges)
    uint32_t edges;
    uint32_t footprint;  // GM reads and writes: index into footprints_
    uint32_t pipe_slot;  // core * kNumPipes + pipe, for instructions on a pipe
    OpKind kind;
    int8_t pipe;
    bool is_set;
    bool vector_core;
  };
  std::vector<Node> nodes_;
  std::vector<GmRegion> footprints_;
  std::vector<double> pipe_done_;
  // A min-heap on (ready time, id), packed into one integer for a comparison without
  // branches: times are sums and maxima of non-negative numbers (never -0 or NaN), so their
  // bit patterns order like the times, and the id below them breaks ties as before.
  __extension__ using Key = unsigned __int128;
  std::vector<Key> queue_;
  L2CacheModel l2_{0, 1};
};

// The same, with the caller's working memory.
// Discrete-event simulation of a finalized program. Every pipe is an in-order queue; an
// instruction starts when its pipe is free and its flags have fired; GM traffic queues on
// the die's shared L2 and HBM bandwidth (first come, first served in simulated time), with
// L2 residency from an LRU model. Deterministic for a given program and profile.
//
// Fails, instead of hanging, when the flags form a cycle (a deadlock) and when two sets of
// one intra-core flag are outstanding at once (illegal on A2/A3), or a cross-core counter
// would exceed its 16 outstanding sets.
absl::StatusOr<LaunchTiming> SimulateLaunch(const Program& program, const DeviceProfile& profile,
                                            TimingScratch& scratch);

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_TIMING_MODEL_H_
