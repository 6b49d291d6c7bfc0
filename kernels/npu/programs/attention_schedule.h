#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_SCHEDULE_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_SCHEDULE_H_

#include <vector>

#include "kernels/npu/programs/attention_workload.h"

namespace mlaserve::npu {

// One pass of a row group over one block of up to 512 keys.
struct AttentionTask {
  int group = 0;
  int begin = 0;       // first key of the block
  int tokens = 0;      // keys in the block
  bool first = false;  // first block of its group
  bool last = false;   // last block of its group
  int group_slot = 0;  // alternates between consecutive groups of a core (double buffers)
};

// Assigns whole row groups to AIC blocks, longest first onto the least-loaded block (LPT),
// and lists each block's tasks in the order its preload pipeline runs them. A group stays on
// one block because its output accumulator lives there for the whole pass. Groups with no
// visible key get no task.
std::vector<std::vector<AttentionTask>> ScheduleAttention(const AttentionWorkload& workload,
                                                          int max_blocks);

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_SCHEDULE_H_
