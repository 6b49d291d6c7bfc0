#ifndef MLASERVE_KERNELS_NPU_LAUNCH_REPORT_H_
#define MLASERVE_KERNELS_NPU_LAUNCH_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

namespace mlaserve::npu {

// What every launch returns: the modelled device time and where it went, and, when the
// launch executed, the host time it took.
struct LaunchReport {
  std::string kernel;
  int block_dim = 0;
  int64_t modeled_cycles = 0;
  double modeled_us = 0;
  // Busy fraction of each pipe over the launch, averaged over all cores of that kind on
  // the device: "AIC.MTE2", "AIC.MTE1", "AIC.M", "AIC.FIX", "AIV.MTE2", "AIV.V", "AIV.MTE3".
  std::map<std::string, double> pipe_busy;
  double flops = 0;
  double fu = 0;  // flops / (modelled seconds * device peak)
  int64_t instructions = 0;
  int64_t gm_read_bytes = 0;
  int64_t hbm_read_bytes = 0;
  int64_t gm_write_bytes = 0;
  // Host wall time of the launch's phases. The emulator's own bookkeeping is split out so
  // a caller can see where host time goes besides the arithmetic:
  double host_record_ms = 0;  // recording, finalizing and checking the GM accesses
  double host_model_ms = 0;   // the timing model (SimulateLaunch)
  // Executing the payloads (the timing model runs beside them, on the launching thread);
  // absent for model-only launches.
  std::optional<double> host_ms;
  // Every MMAD shape the cube issued and how often: what a fair host SGEMM baseline runs.
  std::map<std::tuple<int, int, int>, int64_t> mmad_shapes;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_LAUNCH_REPORT_H_
