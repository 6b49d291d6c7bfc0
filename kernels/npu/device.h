#ifndef MLASERVE_KERNELS_NPU_DEVICE_H_
#define MLASERVE_KERNELS_NPU_DEVICE_H_

#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/npu/device_kernel.h"
#include "kernels/npu/device_profile.h"
#include "kernels/npu/global_memory.h"
#include "kernels/npu/host_executor.h"
#include "kernels/npu/launch_report.h"
#include "kernels/npu/local_memory.h"
#include "kernels/npu/program.h"
#include "kernels/npu/timing_model.h"

namespace mlaserve::npu {

struct DeviceOptions {
  // Host threads that execute the cores' work; AIC and AIV work overlaps across them.
  int host_threads = 2;
};

enum class ExecutionMode {
  kExecute,    // compute the real result and model its time
  kModelOnly,  // model the time only: no host arithmetic, no host memory for GM data
};

// One emulated NPU: it executes kernels for real on the host and models their duration on
// the part its profile describes. Launches on one device run one at a time, like a single
// device stream; a pool holds several devices for parallelism.
class Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(DeviceProfile profile,
                                                        DeviceOptions options = {});

  const DeviceProfile& profile() const { return profile_; }
  GlobalMemory& gm() { return gm_; }
  int host_threads() const { return executor_.threads(); }
  // At most `n` of the host threads compute at once (HostExecutor::SetParallelism: at once,
  // also during a launch); all of them until first called. Thread-safe.
  void SetHostParallelism(int n) { executor_.SetParallelism(n); }

  absl::StatusOr<LaunchReport> Launch(const DeviceKernel& kernel, ExecutionMode mode);
  // Launches `kernels` in order, as one stream: each runs after the previous one finished,
  // but the next one is recorded while this one runs (recording reads only the kernels and
  // GM's addresses, never memory a launch writes). A failed recording or model fails the
  // sequence after the launch in flight has finished; reports of the launches before it are
  // lost with it.
  absl::StatusOr<std::vector<LaunchReport>> LaunchSequence(
      std::span<const DeviceKernel* const> kernels, ExecutionMode mode);

 private:
  Device(DeviceProfile profile, DeviceOptions options);

  // Records kernel `kernel` into a program on `buffers`, finalized and its DMAs checked.
  absl::StatusOr<std::unique_ptr<Program>> Record(const DeviceKernel& kernel, bool execute,
                                                  ProgramBuffers& buffers, double& record_ms);
  // A finished launch's report from its program and modelled timing.
  void FillReport(const DeviceKernel& kernel, const Program& program, const LaunchTiming& timing,
                  LaunchReport& report) const;

  const DeviceProfile profile_;
  GlobalMemory gm_;
  std::mutex launch_mu_;          // one launch at a time; std::mutex for TSan (see GlobalMemory)
  LocalMemoryStorage local_;      // guarded by launch_mu_
  TimingScratch timing_scratch_;  // guarded by launch_mu_
  ProgramBuffers program_buffers_[2];  // guarded by launch_mu_: the running and next program
  HostExecutor executor_;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_DEVICE_H_
