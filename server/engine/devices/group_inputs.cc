#include "server/engine/devices/group_inputs.h"

#include <algorithm>

#include "kernels/core/latent_decode.h"

namespace mlaserve::engine {

TensorView<const Bf16, 4> GroupInputs::QNope(const ModelConfig& m) const {
  return *TensorView<const Bf16, 4>::Create(std::span<const Bf16>(q_nope), {members, sq, heads, m.dn});
}

TensorView<const Bf16, 4> GroupInputs::QPe(const ModelConfig& m) const {
  return *TensorView<const Bf16, 4>::Create(std::span<const Bf16>(q_pe), {members, sq, heads, m.dr});
}

GroupInputs GatherGroupInputs(const BatchPlan& plan, const GroupPlan& group,
                              const ModelConfig& model) {
  GroupInputs in;
  in.members = static_cast<int>(group.members.size());
  in.sq = group.sq;
  in.heads = model.heads;
  for (int index : group.members) {
    const PlannedQuery& pq = plan.queries[index];
    const DecodeQuery& q = *pq.query;
    if (group.space == QuerySpace::kHead) {
      in.q_nope.insert(in.q_nope.end(), q.q_nope.begin(), q.q_nope.end());
      in.q_pe.insert(in.q_pe.end(), q.q_pe.begin(), q.q_pe.end());
    } else {
      in.q_latent.insert(in.q_latent.end(), q.q_latent.begin(), q.q_latent.end());
    }
    const int32_t length = plan.sequence(pq).length;
    in.lengths.push_back(length);
    for (int s = 0; s < group.sq; ++s) in.visible.push_back(VisibleKeys(length, group.sq, s, true));
  }
  return in;
}

void ScatterGroupOutputs(const GroupPlan& group, int heads, int width,
                         std::span<const float> out, std::span<const float> lse,
                         DeviceRun& run) {
  const int64_t rows = static_cast<int64_t>(group.sq) * heads;  // per member
  for (size_t m = 0; m < group.members.size(); ++m) {
    QueryOutput& dst = run.outputs[group.members[m]];
    dst.out.assign(out.begin() + m * rows * width, out.begin() + (m + 1) * rows * width);
    dst.lse.assign(lse.begin() + m * rows, lse.begin() + (m + 1) * rows);
  }
}

}  // namespace mlaserve::engine
