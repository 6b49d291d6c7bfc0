#include "kernels/npu/programs/attention_schedule.h"

#include <algorithm>
#include <numeric>

#include "kernels/core/tiling.h"

namespace mlaserve::npu {

std::vector<std::vector<AttentionTask>> ScheduleAttention(const AttentionWorkload& workload,
                                                          int max_blocks) {
  std::vector<int> order;
  for (int g = 0; g < static_cast<int>(workload.groups.size()); ++g) {
    if (workload.groups[g].length() > 0) order.push_back(g);
  }
  auto blocks_of = [&](int g) {
    return (workload.groups[g].length() + kKvBlockTokens - 1) / kKvBlockTokens;
  };
  // Largest first; ties by index so the schedule is deterministic.
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return blocks_of(a) > blocks_of(b); });
  const int cores = std::min<int>(max_blocks, static_cast<int>(order.size()));
  std::vector<std::vector<int>> assigned(cores);
  std::vector<int64_t> load(cores, 0);
  for (int g : order) {
    const int target = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    assigned[target].push_back(g);
    load[target] += blocks_of(g) * static_cast<int64_t>(workload.groups[g].rows);
  }
  std::vector<std::vector<AttentionTask>> schedule(cores);
  for (int c = 0; c < cores; ++c) {
    int slot = 0;
    for (int g : assigned[c]) {
      const int length = workload.groups[g].length();
      for (int begin = 0; begin < length; begin += kKvBlockTokens) {
        AttentionTask task;
        task.group = g;
        task.begin = begin;
        task.tokens = std::min(kKvBlockTokens, length - begin);
        task.first = begin == 0;
        task.last = begin + kKvBlockTokens >= length;
        task.group_slot = slot;
        schedule[c].push_back(task);
      }
      slot ^= 1;
    }
  }
  return schedule;
}

}  // namespace mlaserve::npu
