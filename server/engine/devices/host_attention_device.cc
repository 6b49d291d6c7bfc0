#include "server/engine/devices/host_attention_device.h"

#include "common/status_macros.h"
#include "kernels/core/row_matmul.h"

namespace mlaserve::engine {

HostAttentionDevice::HostAttentionDevice(int threads) : runner_(threads) {
  info_.profile = "host";
  info_.kind = "host";
  info_.host_threads = runner_.threads();
  info_.parallel_units = runner_.threads();
  info_.split_block_tokens = HostBatchRunner::kSplitBlockTokens;
  info_.split_part_overhead_blocks = HostBatchRunner::kSplitPartOverheadBlocks;
  // The row kernel's sums are defined row by row, whatever rows share a call.
  info_.invariant_projection_rows = kRowMatmulRows;
}

absl::StatusOr<DeviceRun> HostAttentionDevice::Run(const BatchSteps& steps) {
  DeviceRun run;
  ASSIGN_OR_RETURN(run.buffers, runner_.Run(steps));
  return run;
}

}  // namespace mlaserve::engine
