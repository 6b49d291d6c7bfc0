#include "server/service/mla_serve_service.h"

#include <memory>
#include <optional>
#include <string>

#include "common/status_macros.h"
#include "kernels/core/tensor_view.h"
#include "server/service/append_kv_reactor.h"
#include "server/service/call_deadline.h"
#include "server/service/decode_stream_reactor.h"
#include "server/service/kv_request_codec.h"
#include "server/service/server_info.h"
#include "server/service/status_mapping.h"
#include "server/service/wire_message.h"

namespace mlaserve::service {
namespace {

constexpr char kDrainingMessage[] = "the server is shutting down; call another replica";

}  // namespace

MlaServeService::MlaServeService(engine::Engine& engine, ServiceMetrics& metrics,
                                 ServiceOptions options)
    : engine_(engine), metrics_(metrics), options_(options), dispatcher_(engine, metrics) {}

grpc::ServerUnaryReactor* MlaServeService::Answer(grpc::CallbackServerContext* context,
                                                  absl::string_view rpc, absl::Time start,
                                                  const absl::Status& status) {
  metrics_.RecordRpc(rpc, status.code(), absl::Now() - start);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  calls_.EndUnary();
  return reactor;
}

grpc::ServerUnaryReactor* MlaServeService::Refuse(grpc::CallbackServerContext* context,
                                                  absl::string_view rpc, absl::Time start) {
  const absl::Status status = absl::UnavailableError(kDrainingMessage);
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

template <typename Request, typename Response, typename Handler>
grpc::ServerUnaryReactor* MlaServeService::Unary(grpc::CallbackServerContext* context,
                                                 absl::string_view rpc,
                                                 const grpc::ByteBuffer* request_bytes,
                                                 grpc::ByteBuffer* response_bytes, Handler handle) {
  const absl::Time start = absl::Now();
  if (!calls_.BeginUnary()) return Refuse(context, rpc, start);
  Request request;
  Response response;
  absl::Status status = ParseWireMessage(*request_bytes, "request", &request);
  if (status.ok()) status = handle(request, &response);
  if (status.ok()) SerializeWireMessage(response, response_bytes);
  return Answer(context, rpc, start, status);
}

grpc::ServerUnaryReactor* MlaServeService::GetServerInfo(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return Unary<v1::GetServerInfoRequest, v1::GetServerInfoResponse>(
      context, "GetServerInfo", request, response,
      [this](const v1::GetServerInfoRequest&, v1::GetServerInfoResponse* info) {
        *info = MakeServerInfo(engine_.Info(), options_.max_message_bytes);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* MlaServeService::RegisterPrefix(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Unary<v1::RegisterPrefixRequest, v1::RegisterPrefixResponse>(
      context, "RegisterPrefix", request, response,
      [this](const v1::RegisterPrefixRequest& r, v1::RegisterPrefixResponse*) -> absl::Status {
        ASSIGN_OR_RETURN(Bf16Tensor latent, ParsePrefixLatent(r, engine_.Info().model));
        using LatentView = TensorView<const Bf16, 3>;
        const LatentView::Index shape{latent.shape[0], latent.shape[1], latent.shape[2]};
        ASSIGN_OR_RETURN(LatentView view, LatentView::Create(latent.values, shape, "latent"));
        ASSIGN_OR_RETURN(const std::optional<KvDtype> kv_dtype,
                         ParseKvDtype(r.kv_dtype(), "kv_dtype"));
        return engine_.RegisterPrefix(r.prefix_id(), r.parent_id(), view, kv_dtype);
      });
}

grpc::ServerUnaryReactor* MlaServeService::ReleasePrefix(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return Unary<v1::ReleasePrefixRequest, v1::ReleasePrefixResponse>(
      context, "ReleasePrefix", request, response,
      [this](const v1::ReleasePrefixRequest& r, v1::ReleasePrefixResponse*) {
        return engine_.ReleasePrefix(r.prefix_id());
      });
}

grpc::ServerUnaryReactor* MlaServeService::CreateSequence(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Unary<v1::CreateSequenceRequest, v1::CreateSequenceResponse>(
      context, "CreateSequence", request, response,
      [this](const v1::CreateSequenceRequest& r, v1::CreateSequenceResponse* created) {
        absl::StatusOr<std::optional<KvDtype>> kv_dtype = ParseKvDtype(r.kv_dtype(), "kv_dtype");
        absl::Status status =
            kv_dtype.ok() ? engine_.CreateSequence(r.sequence_id(), r.prefix_id(), *kv_dtype)
                          : kv_dtype.status();
        if (status.ok()) status = DescribeSequence(r.sequence_id(), created->mutable_sequence());
        return status;
      });
}

grpc::ServerUnaryReactor* MlaServeService::ForkSequence(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return Unary<v1::ForkSequenceRequest, v1::ForkSequenceResponse>(
      context, "ForkSequence", request, response,
      [this](const v1::ForkSequenceRequest& r, v1::ForkSequenceResponse* forked) {
        absl::Status status = engine_.ForkSequence(r.source_sequence_id(), r.new_sequence_id());
        if (status.ok()) status = DescribeSequence(r.new_sequence_id(), forked->mutable_sequence());
        return status;
      });
}

grpc::ServerUnaryReactor* MlaServeService::ReleaseSequence(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return Unary<v1::ReleaseSequenceRequest, v1::ReleaseSequenceResponse>(
      context, "ReleaseSequence", request, response,
      [this](const v1::ReleaseSequenceRequest& r, v1::ReleaseSequenceResponse*) {
        return engine_.ReleaseSequence(r.sequence_id());
      });
}

grpc::ServerUnaryReactor* MlaServeService::GetSequence(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return Unary<v1::GetSequenceRequest, v1::GetSequenceResponse>(
      context, "GetSequence", request, response,
      [this](const v1::GetSequenceRequest& r, v1::GetSequenceResponse* found) {
        return DescribeSequence(r.sequence_id(), found->mutable_sequence());
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* MlaServeService::AppendKv(grpc::CallbackServerContext*,
                                                                     grpc::ByteBuffer* response) {
  return new AppendKvReactor(engine_, metrics_, calls_, response);
}

grpc::ServerUnaryReactor* MlaServeService::Decode(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request_bytes,
                                                  grpc::ByteBuffer* response_bytes) {
  const absl::Time start = absl::Now();
  if (!calls_.BeginUnary()) return Refuse(context, "Decode", start);
  // The engine reads the request's tensors in place until it answers.
  struct Call {
    v1::DecodeRequest request;
    v1::DecodeResponse response;
  };
  auto call = std::make_unique<Call>();
  if (absl::Status parsed = ParseWireMessage(*request_bytes, "request", &call->request);
      !parsed.ok()) {
    return Answer(context, "Decode", start, parsed);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Call& ref = *call;
  dispatcher_.Dispatch(
      ref.request, CallDeadline(*context), [context] { return context->IsCancelled(); },
      &ref.response,
      [this, reactor, start, response_bytes, call = std::move(call)](absl::Status status) {
        if (status.ok()) SerializeWireMessage(call->response, response_bytes);
        metrics_.RecordRpc("Decode", status.code(), absl::Now() - start);
        reactor->Finish(ToGrpcStatus(status));
        calls_.EndUnary();
      });
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MlaServeService::DecodeStream(
    grpc::CallbackServerContext* context) {
  return new DecodeStreamReactor(context, dispatcher_, metrics_, calls_,
                                 options_.stream_max_in_flight);
}

}  // namespace mlaserve::service
