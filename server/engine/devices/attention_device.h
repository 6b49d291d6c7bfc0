#ifndef MLASERVE_SERVER_ENGINE_DEVICES_ATTENTION_DEVICE_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_ATTENTION_DEVICE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/plan/batch_plan.h"
#include "server/engine/engine_types.h"
#include "server/engine/model/model_weights.h"

namespace mlaserve::engine {

// One query's answer as a device computes it (normalised fp32).
struct QueryOutput {
  std::vector<float> out;  // [sq][heads][dv] (head space) or [sq][heads][dl] (latent)
  std::vector<float> lse;  // [sq][heads]
};

struct DeviceRun {
  std::vector<QueryOutput> outputs;  // by batch index; empty for queries the plan dropped
  double modeled_us = 0;             // modelled device time of the batch (0 on the host)
  double host_ms = 0;                // host wall time spent
};

// What the planner and the pool know of a device: it executes a planned batch. The emulated
// NPU is one; the host (CPU-direct) is another; a GPU could be a third.
//
// Every device computes exactly what HostAttentionDevice does (see there for the
// arithmetic), so a batch's answers do not depend on which device ran it.
class AttentionDevice {
 public:
  virtual ~AttentionDevice() = default;
  virtual const DeviceInfo& info() const = 0;
  // Runs one batch; not called concurrently on one device.
  virtual absl::StatusOr<DeviceRun> Run(const BatchPlan& plan, const ModelWeights& weights) = 0;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_ATTENTION_DEVICE_H_
