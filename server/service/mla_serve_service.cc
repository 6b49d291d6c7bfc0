#include "server/service/mla_serve_service.h"

#include <string>

#include "common/status_macros.h"
#include "kernels/core/tensor_view.h"
#include "server/service/append_kv_reactor.h"
#include "server/service/call_deadline.h"
#include "server/service/decode_stream_reactor.h"
#include "server/service/kv_request_codec.h"
#include "server/service/server_info.h"
#include "server/service/status_mapping.h"

namespace mlaserve::service {

MlaServeService::MlaServeService(engine::Engine& engine, ServiceMetrics& metrics,
                                 ServiceOptions options)
    : engine_(engine), metrics_(metrics), options_(options), dispatcher_(engine, metrics) {}

grpc::ServerUnaryReactor* MlaServeService::Answer(grpc::CallbackServerContext* context,
                                                  absl::string_view rpc, absl::Time start,
                                                  const absl::Status& status) {
  metrics_.RecordRpc(rpc, status.code(), absl::Now() - start);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

absl::Status MlaServeService::DescribeSequence(absl::string_view sequence_id,
                                               v1::Sequence* sequence) const {
  ASSIGN_OR_RETURN(engine::SequenceInfo info, engine_.GetSequence(sequence_id));
  sequence->set_sequence_id(info.id);
  sequence->set_prefix_id(info.prefix_id);
  sequence->mutable_layer_lengths()->Assign(info.lengths.begin(), info.lengths.end());
  sequence->set_kv_dtype(ToWire(info.kv_dtype));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* MlaServeService::GetServerInfo(grpc::CallbackServerContext* context,
                                                         const v1::GetServerInfoRequest*,
                                                         v1::GetServerInfoResponse* response) {
  const absl::Time start = absl::Now();
  *response = MakeServerInfo(engine_.Info(), options_.max_message_bytes);
  return Answer(context, "GetServerInfo", start, absl::OkStatus());
}

grpc::ServerUnaryReactor* MlaServeService::RegisterPrefix(grpc::CallbackServerContext* context,
                                                          const v1::RegisterPrefixRequest* request,
                                                          v1::RegisterPrefixResponse*) {
  const absl::Time start = absl::Now();
  const absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Bf16Tensor latent, ParsePrefixLatent(*request, engine_.Info().model));
    using LatentView = TensorView<const Bf16, 3>;
    const LatentView::Index shape{latent.shape[0], latent.shape[1], latent.shape[2]};
    ASSIGN_OR_RETURN(LatentView view, LatentView::Create(latent.values, shape, "latent"));
    ASSIGN_OR_RETURN(const std::optional<KvDtype> kv_dtype,
                     ParseKvDtype(request->kv_dtype(), "kv_dtype"));
    return engine_.RegisterPrefix(request->prefix_id(), request->parent_id(), view, kv_dtype);
  }();
  return Answer(context, "RegisterPrefix", start, status);
}

grpc::ServerUnaryReactor* MlaServeService::ReleasePrefix(grpc::CallbackServerContext* context,
                                                         const v1::ReleasePrefixRequest* request,
                                                         v1::ReleasePrefixResponse*) {
  const absl::Time start = absl::Now();
  return Answer(context, "ReleasePrefix", start, engine_.ReleasePrefix(request->prefix_id()));
}

grpc::ServerUnaryReactor* MlaServeService::CreateSequence(grpc::CallbackServerContext* context,
                                                          const v1::CreateSequenceRequest* request,
                                                          v1::CreateSequenceResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<KvDtype>> kv_dtype = ParseKvDtype(request->kv_dtype(), "kv_dtype");
  absl::Status status = kv_dtype.ok() ? engine_.CreateSequence(request->sequence_id(),
                                                               request->prefix_id(), *kv_dtype)
                                      : kv_dtype.status();
  if (status.ok()) status = DescribeSequence(request->sequence_id(), response->mutable_sequence());
  return Answer(context, "CreateSequence", start, status);
}

grpc::ServerUnaryReactor* MlaServeService::ForkSequence(grpc::CallbackServerContext* context,
                                                        const v1::ForkSequenceRequest* request,
                                                        v1::ForkSequenceResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status status =
      engine_.ForkSequence(request->source_sequence_id(), request->new_sequence_id());
  if (status.ok()) {
    status = DescribeSequence(request->new_sequence_id(), response->mutable_sequence());
  }
  return Answer(context, "ForkSequence", start, status);
}

grpc::ServerUnaryReactor* MlaServeService::ReleaseSequence(
    grpc::CallbackServerContext* context, const v1::ReleaseSequenceRequest* request,
    v1::ReleaseSequenceResponse*) {
  const absl::Time start = absl::Now();
  return Answer(context, "ReleaseSequence", start, engine_.ReleaseSequence(request->sequence_id()));
}

grpc::ServerUnaryReactor* MlaServeService::GetSequence(grpc::CallbackServerContext* context,
                                                       const v1::GetSequenceRequest* request,
                                                       v1::GetSequenceResponse* response) {
  const absl::Time start = absl::Now();
  return Answer(context, "GetSequence", start,
                DescribeSequence(request->sequence_id(), response->mutable_sequence()));
}

grpc::ServerReadReactor<v1::AppendKvChunk>* MlaServeService::AppendKv(
    grpc::CallbackServerContext*, v1::AppendKvResponse* response) {
  return new AppendKvReactor(engine_, metrics_, response);
}

grpc::ServerUnaryReactor* MlaServeService::Decode(grpc::CallbackServerContext* context,
                                                  const v1::DecodeRequest* request,
                                                  v1::DecodeResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  dispatcher_.Dispatch(
      *request, CallDeadline(*context), [context] { return context->IsCancelled(); }, response,
      [this, reactor, start](absl::Status status) {
        metrics_.RecordRpc("Decode", status.code(), absl::Now() - start);
        reactor->Finish(ToGrpcStatus(status));
      });
  return reactor;
}

grpc::ServerBidiReactor<v1::DecodeStreamRequest, v1::DecodeStreamResponse>*
MlaServeService::DecodeStream(grpc::CallbackServerContext* context) {
  return new DecodeStreamReactor(context, dispatcher_, metrics_, streams_,
                                 options_.stream_max_in_flight);
}

}  // namespace mlaserve::service
