#include "client/loadgen/grpc_load_target.h"

#include "client/loadgen/batch_decode.h"
#include "client/tensor_helpers.h"

namespace mlaserve::loadgen {
namespace {

v1::Tensor Rows(std::span<const Bf16> values, std::initializer_list<int64_t> shape) {
  const std::vector<int64_t> dims(shape);
  return client::Bf16Tensor(values, dims);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcLoadTarget>> GrpcLoadTarget::Create(
    std::unique_ptr<client::ServingClient> client, bool packed) {
  absl::StatusOr<v1::GetServerInfoResponse> info = client->GetServerInfo();
  if (!info.ok()) return info.status();
  const v1::ModelInfo& m = info->model();
  TargetModel model{
      m.name(),    m.layers(), m.heads(), m.dn(), m.dr(), m.dl(), info->limits().max_batch(),
      std::nullopt};
  model.dv = m.dv();
  if (info->default_kv_dtype() == v1::KV_DTYPE_FP8) model.default_kv_dtype = KvDtype::kFp8;
  if (info->default_kv_dtype() == v1::KV_DTYPE_BF16) model.default_kv_dtype = KvDtype::kBf16;
  return std::unique_ptr<GrpcLoadTarget>(
      new GrpcLoadTarget(std::move(client), std::move(model), packed));
}

namespace {

v1::KvDtype ToWire(std::optional<KvDtype> kv_dtype) {
  if (!kv_dtype.has_value()) return v1::KV_DTYPE_UNSPECIFIED;
  return *kv_dtype == KvDtype::kFp8 ? v1::KV_DTYPE_FP8 : v1::KV_DTYPE_BF16;
}

}  // namespace

absl::Status GrpcLoadTarget::RegisterPrefix(const std::string& id, std::span<const Bf16> latent,
                                            int tokens, std::optional<KvDtype> kv_dtype) {
  return client_->RegisterPrefix(id, "", Rows(latent, {model_.layers, tokens, model_.dk()}),
                                 ToWire(kv_dtype));
}

absl::Status GrpcLoadTarget::ReleasePrefix(const std::string& id) {
  return client_->ReleasePrefix(id);
}

absl::Status GrpcLoadTarget::CreateSequence(const std::string& id, const std::string& prefix_id,
                                            std::optional<KvDtype> kv_dtype) {
  return client_->CreateSequence(id, prefix_id, ToWire(kv_dtype)).status();
}

absl::Status GrpcLoadTarget::ReleaseSequence(const std::string& id) {
  return client_->ReleaseSequence(id);
}

absl::Status GrpcLoadTarget::AppendKv(const std::string& id, int layer, int64_t position,
                                      std::span<const Bf16> rows) {
  const int64_t n = static_cast<int64_t>(rows.size()) / model_.dk();
  const client::KvAppend append{id, layer, position, Rows(rows, {n, model_.dk()}), {}};
  return client_->AppendKv(std::span<const client::KvAppend>(&append, 1));
}

absl::StatusOr<std::vector<LoadAnswer>> GrpcLoadTarget::Decode(
    const std::vector<LoadQuery>& queries) {
  if (packed_) return DecodeAsBatch(*client_, model_, queries);
  v1::DecodeRequest request;
  for (const LoadQuery& q : queries) {
    v1::DecodeQuery wire =
        q.head_space ? client::HeadSpaceQuery(q.sequence_id, q.layer, q.sq,
                                              Rows(q.q_nope, {q.sq, model_.heads, model_.dn}),
                                              Rows(q.q_pe, {q.sq, model_.heads, model_.dr}))
                     : client::LatentQuery(q.sequence_id, q.layer, q.sq,
                                           Rows(q.q_latent, {q.sq, model_.heads, model_.dk()}));
    client::AppendBeforeDecode(wire, Rows(q.append, {1, model_.dk()}), q.append_position);
    *request.add_queries() = std::move(wire);
  }
  request.set_output_dtype(v1::DTYPE_BF16);
  absl::StatusOr<v1::DecodeResponse> response = client_->DecodeRaw(request);
  if (!response.ok()) return response.status();
  std::vector<LoadAnswer> answers;
  for (const v1::DecodeResult& r : response->results()) answers.push_back(ToLoadAnswer(r.plan()));
  return answers;
}

}  // namespace mlaserve::loadgen
