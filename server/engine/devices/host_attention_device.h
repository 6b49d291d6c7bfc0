#ifndef MLASERVE_SERVER_ENGINE_DEVICES_HOST_ATTENTION_DEVICE_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_HOST_ATTENTION_DEVICE_H_

#include "kernels/mla/host_batch_runner.h"
#include "server/engine/devices/attention_device.h"

namespace mlaserve::engine {

// The CPU-direct device: a batch's steps run by the host kernels (HostBatchRunner), the jobs
// of each step spread over `threads` host threads.
class HostAttentionDevice final : public AttentionDevice {
 public:
  explicit HostAttentionDevice(int threads = 1);
  const DeviceInfo& info() const override { return info_; }
  absl::StatusOr<DeviceRun> Run(const BatchSteps& steps) override;

 private:
  HostBatchRunner runner_;
  DeviceInfo info_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_HOST_ATTENTION_DEVICE_H_
