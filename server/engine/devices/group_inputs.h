#ifndef MLASERVE_SERVER_ENGINE_DEVICES_GROUP_INPUTS_H_
#define MLASERVE_SERVER_ENGINE_DEVICES_GROUP_INPUTS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/core/bfloat16.h"
#include "kernels/core/tensor_view.h"
#include "server/engine/devices/attention_device.h"
#include "server/engine/plan/batch_plan.h"
#include "server/engine/model/model_config.h"

namespace mlaserve::engine {

// A group's queries laid out contiguously, member-major, then token, then head: the form
// every device consumes.
struct GroupInputs {
  int members = 0;
  int sq = 0;
  int heads = 0;
  std::vector<Bf16> q_nope;    // head space: [members][sq][heads][dn]
  std::vector<Bf16> q_pe;      // head space: [members][sq][heads][dr]
  std::vector<Bf16> q_latent;  // latent space: [members][sq][heads][dl + dr]
  std::vector<int32_t> lengths;  // [members]: keys each member's sequence holds
  std::vector<int32_t> visible;  // [members][sq]: keys each query token sees (causal)

  TensorView<const Bf16, 4> QNope(const ModelConfig& m) const;
  TensorView<const Bf16, 4> QPe(const ModelConfig& m) const;
};

GroupInputs GatherGroupInputs(const BatchPlan& plan, const GroupPlan& group,
                              const ModelConfig& model);

// Copies a group's results ([members][sq][heads][width] and [members][sq][heads]) into the
// per-query outputs of a run.
void ScatterGroupOutputs(const GroupPlan& group, int heads, int width,
                         std::span<const float> out, std::span<const float> lse,
                         DeviceRun& run);

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DEVICES_GROUP_INPUTS_H_
