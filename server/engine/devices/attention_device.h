#ifndef MLASERVE_SERVER_ENGINE_DEVICES_ATTENTION_DEVICE_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_ATTENTION_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/mla/batch_steps.h"
#include "server/engine/engine_types.h"

namespace mlaserve::engine {

struct DeviceRun {
  std::unique_ptr<BatchBuffers> buffers;  // the batch's memory after its last step
  double modeled_us = 0;                  // modelled device time of the batch (0 on the host)
};

// What the planner and the pool know of a device: it runs a batch's steps
// (kernels/mla/batch_steps.h). The emulated NPU is one; the host (CPU-direct) is another; a
// GPU could be a third. Every device computes a step exactly as the host runner does, so a
// batch's answers do not depend on which device ran it.
class AttentionDevice {
 public:
  virtual ~AttentionDevice() = default;
  virtual const DeviceInfo& info() const = 0;
  // Runs one batch; not called concurrently on one device. The buffers may hold device
  // memory: release them before the device goes.
  virtual absl::StatusOr<DeviceRun> Run(const BatchSteps& steps) = 0;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_ATTENTION_DEVICE_H_
