#include "bench/engine_load_target.h"

#include <future>

#include "common/status_macros.h"
#include "kernels/core/tensor_view.h"

namespace mlaserve::bench {

absl::StatusOr<loadgen::TargetModel> EngineLoadTarget::Model() {
  const engine::EngineInfo& info = engine_.Info();
  return loadgen::TargetModel{info.model.name, info.model.layers,    info.model.heads,
                              info.model.dn,   info.model.dr,        info.model.dl,
                              info.max_batch,  info.default_kv_dtype};
}

absl::Status EngineLoadTarget::RegisterPrefix(const std::string& id, std::span<const Bf16> latent,
                                              int tokens, std::optional<KvDtype> kv_dtype) {
  const engine::ModelConfig& m = engine_.Info().model;
  ASSIGN_OR_RETURN(auto view,
                   (TensorView<const Bf16, 3>::Create(latent, {m.layers, tokens, m.dk_latent()})));
  return engine_.RegisterPrefix(id, "", view, kv_dtype);
}

absl::Status EngineLoadTarget::AppendKv(const std::string& id, int layer, int64_t position,
                                        std::span<const Bf16> rows) {
  const int dk = engine_.Info().model.dk_latent();
  ASSIGN_OR_RETURN(auto view, (TensorView<const Bf16, 2>::Create(
                                  rows, {static_cast<int64_t>(rows.size()) / dk, dk})));
  return engine_.AppendKv(id, layer, position, view);
}

absl::StatusOr<std::vector<loadgen::LoadAnswer>> EngineLoadTarget::Decode(
    const std::vector<loadgen::LoadQuery>& queries) {
  const engine::ModelConfig& m = engine_.Info().model;
  using View3 = TensorView<const Bf16, 3>;
  using View2 = TensorView<const Bf16, 2>;
  // The workload's buffers outlive the call: the engine reads them in place, as it reads a
  // gRPC request's bytes.
  std::vector<engine::DecodeQuery> batch;
  for (const loadgen::LoadQuery& q : queries) {
    engine::DecodeQuery e;
    e.sequence_id = q.sequence_id;
    e.layer = q.layer;
    e.sq = q.sq;
    e.space = q.head_space ? engine::QuerySpace::kHead : engine::QuerySpace::kLatent;
    if (q.head_space) {
      ASSIGN_OR_RETURN(e.q_nope, View3::Create(q.q_nope, {q.sq, m.heads, m.dn}, "q_nope"));
      ASSIGN_OR_RETURN(e.q_pe, View3::Create(q.q_pe, {q.sq, m.heads, m.dr}, "q_pe"));
    } else {
      ASSIGN_OR_RETURN(e.q_latent,
                       View3::Create(q.q_latent, {q.sq, m.heads, m.dk_latent()}, "q_latent"));
    }
    if (!q.append.empty()) {
      const int64_t rows = static_cast<int64_t>(q.append.size()) / m.dk_latent();
      ASSIGN_OR_RETURN(e.append_rows, View2::Create(q.append, {rows, m.dk_latent()}, "append"));
      e.append_position = q.append_position;
    }
    batch.push_back(e);
  }
  std::promise<absl::StatusOr<std::vector<loadgen::LoadAnswer>>> promise;
  auto future = promise.get_future();
  engine_.Decode(std::move(batch), {},
                 [&promise](absl::StatusOr<std::span<const engine::DecodeAnswer>> answers) {
                   if (!answers.ok()) {
                     promise.set_value(answers.status());
                     return;
                   }
                   std::vector<loadgen::LoadAnswer> out;
                   for (const engine::DecodeAnswer& a : *answers) {
                     const engine::PlanInfo& p = a.plan;
                     out.push_back({p.formulation == engine::Formulation::kHybrid, p.group_size,
                                    p.batch_size, p.queue_us, p.device_modeled_us,
                                    p.device_host_ms * 1e3, p.absorb_kv_dtype == KvDtype::kFp8});
                   }
                   promise.set_value(std::move(out));
                 });
  return future.get();
}

}  // namespace mlaserve::bench
