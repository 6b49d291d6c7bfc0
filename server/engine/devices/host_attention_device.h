#ifndef MLASERVE_SERVER_ENGINE_DEVICES_HOST_ATTENTION_DEVICE_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_HOST_ATTENTION_DEVICE_H_

#include "server/engine/devices/attention_device.h"

namespace mlaserve::engine {

// The CPU-direct device, and the definition of what every device computes for a group
// (G members, sq tokens, H heads; rows ordered member, token, head):
//
//  1. q_lat = [bf16(q_nope . W_UK), q_pe] for head-space queries (AbsorbQueries over all the
//     group's rows at once), or the given latent q.
//  2. Absorb part: AMLA over each member's latent keys from AbsorbFrom() (0, or the end of
//     the shared prefix for a hybrid group) to its length; a token sees
//     clamp(visible - AbsorbFrom(), 0, length - AbsorbFrom()) of them.
//  3. Head space: out = bf16(o_lat) . W_UV^T (ProjectLatentOutputs over all rows at once).
//  4. Hybrid: per prefix level (root first) and head, AMLA of the G*sq rows
//     [q_nope[h], q_pe[h]] over that level's expanded K/V, a token seeing
//     clamp(visible - level.begin, 0, level length) keys; the levels are LSE-combined in
//     order, then combined with the absorb part.
class HostAttentionDevice final : public AttentionDevice {
 public:
  HostAttentionDevice();
  const DeviceInfo& info() const override { return info_; }
  absl::StatusOr<DeviceRun> Run(const BatchPlan& plan, const ModelWeights& weights) override;

 private:
  DeviceInfo info_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_HOST_ATTENTION_DEVICE_H_
