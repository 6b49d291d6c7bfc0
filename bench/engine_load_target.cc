#include "bench/engine_load_target.h"

#include <future>

#include "common/status_macros.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve::bench {

absl::StatusOr<loadgen::TargetModel> EngineLoadTarget::Model() {
  const engine::EngineInfo& info = engine_.Info();
  return loadgen::TargetModel{info.model.name, info.model.layers, info.model.heads, info.model.dn,
                              info.model.dr,   info.model.dl,     info.max_batch};
}

absl::Status EngineLoadTarget::RegisterPrefix(const std::string& id, std::span<const Bf16> latent, int tokens) {
  const engine::ModelConfig& m = engine_.Info().model;
  ASSIGN_OR_RETURN(auto view, (TensorView<const Bf16, 3>::Create(latent, {m.layers, tokens, m.dk_latent()})));
  return engine_.RegisterPrefix(id, "", view);
}

absl::Status EngineLoadTarget::AppendKv(const std::string& id, int layer, int64_t position,
                                        std::span<const Bf16> rows) {
  const int dk = engine_.Info().model.dk_latent();
  ASSIGN_OR_RETURN(auto view, (TensorView<const Bf16, 2>::Create(rows, {static_cast<int64_t>(rows.size()) / dk, dk})));
  return engine_.AppendKv(id, layer, position, view);
}

absl::StatusOr<std::vector<loadgen::LoadAnswer>> EngineLoadTarget::Decode(
    const std::vector<loadgen::LoadQuery>& queries) {
  std::vector<engine::DecodeQuery> batch;
  for (const loadgen::LoadQuery& q : queries) {
    engine::DecodeQuery e;
    e.sequence_id = q.sequence_id;
    e.layer = q.layer;
    e.sq = q.sq;
    e.space = q.head_space ? engine::QuerySpace::kHead : engine::QuerySpace::kLatent;
    if (q.head_space) {
      e.q_nope.assign(q.q_nope.begin(), q.q_nope.end());
      e.q_pe.assign(q.q_pe.begin(), q.q_pe.end());
    } else {
      e.q_latent.assign(q.q_latent.begin(), q.q_latent.end());
    }
    e.append_rows.assign(q.append.begin(), q.append.end());
    e.append_position = q.append_position;
    batch.push_back(std::move(e));
  }
  std::promise<absl::StatusOr<std::vector<engine::DecodeAnswer>>> promise;
  auto future = promise.get_future();
  engine_.Decode(std::move(batch), {},
                 [&promise](absl::StatusOr<std::vector<engine::DecodeAnswer>> r) { promise.set_value(std::move(r)); });
  ASSIGN_OR_RETURN(std::vector<engine::DecodeAnswer> answers, future.get());
  std::vector<loadgen::LoadAnswer> out;
  for (const engine::DecodeAnswer& a : answers) {
    const engine::PlanInfo& p = a.plan;
    out.push_back({p.formulation == engine::Formulation::kHybrid, p.group_size, p.batch_size, p.queue_us,
                   p.device_modeled_us, p.device_host_ms * 1e3});
  }
  return out;
}

}  // namespace mlaserve::bench
