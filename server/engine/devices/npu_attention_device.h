#ifndef MLASERVE_SERVER_ENGINE_DEVICES_NPU_ATTENTION_DEVICE_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_NPU_ATTENTION_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/npu/device.h"
#include "kernels/npu/programs/attention_device_kernel.h"
#include "server/engine/devices/attention_device.h"

namespace mlaserve::engine {

// An emulated NPU as a pool device: a batch's steps lowered into launches on one stream
// (npu::BatchLaunch), run for real on the host (the answers equal the host runner's bit for
// bit) while the device model times them. The KV pool, the weights and the expanded K/V are
// mapped into the device's global memory for the batch, not copied; only the queries are
// staged.
class NpuAttentionDevice final : public AttentionDevice {
 public:
  // `device_options.host_threads` are its own; with `lendable_threads` more than those, it
  // has that many host threads, of which it runs its own plus what the pool lends it
  // (LendCpus).
  static absl::StatusOr<std::unique_ptr<NpuAttentionDevice>> Create(
      npu::DeviceProfile profile, npu::DeviceOptions device_options,
      npu::AttentionDeviceKernelOptions kernel_options = {}, int lendable_threads = 0);

  const DeviceInfo& info() const override { return info_; }
  absl::StatusOr<DeviceRun> Run(const BatchSteps& steps) override;
  // Its own `own_threads` and the lent CPUs, as far as its host threads reach.
  void LendCpus(int cpus) override { device_->SetHostParallelism(own_threads_ + cpus); }

 private:
  NpuAttentionDevice(std::unique_ptr<npu::Device> device, npu::AttentionDeviceKernelOptions options,
                     int own_threads);

  std::unique_ptr<npu::Device> device_;
  int own_threads_;
  npu::AttentionDeviceKernelOptions options_;
  DeviceInfo info_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_NPU_ATTENTION_DEVICE_H_
