#include "server/service/mla_serve_service.h"

#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/mlaserve_client.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "kernels/core/tensor_view.h"
#include "server/service/admin_requests.h"
#include "server/service/append_kv_reactor.h"
#include "server/service/call_deadline.h"
#include "server/service/decode_stream_reactor.h"
#include "server/service/kv_request_codec.h"
#include "server/service/kv_requests.h"
#include "server/service/sequence_migration.h"
#include "server/service/server_info.h"
#include "server/service/status_mapping.h"
#include "server/service/tenant_scope.h"
#include "server/service/wire_message.h"
#include "spdlog/spdlog.h"

namespace mlaserve::service {
namespace {

constexpr char kDrainingMessage[] = "the server is shutting down; call another replica";

// Whose share of open streams a stream takes: its tenant, or without tenants the peer's
// address without its port (a client's many connections are one client).
std::string StreamClient(const grpc::CallbackServerContext& context,
                         const absl::StatusOr<Tenant*>& admitted,
                         const std::function<std::string(const std::string&)>& peer_of) {
  if (admitted.ok() && *admitted != nullptr) return absl::StrCat("tenant ", (*admitted)->name);
  const std::string peer = peer_of ? peer_of(context.peer()) : context.peer();
  const size_t port = peer.rfind(':');
  const bool has_port = port != std::string::npos && peer.compare(0, 5, "unix:") != 0;
  return absl::StrCat("client ", has_port ? peer.substr(0, port) : peer);
}

}  // namespace

MlaServeService::MlaServeService(engine::Engine& engine, ServiceMetrics& metrics,
                                 ServiceOptions options)
    : engine_(engine),
      metrics_(metrics),
      options_(options),
      dispatcher_(engine, moved_, metrics),
      calls_(options.max_streams_per_client) {}

MlaServeService::~MlaServeService() {
  std::vector<std::thread> running;
  {
    absl::MutexLock lock(&migrations_mu_);
    running.swap(migrations_);
  }
  for (std::thread& migration : running) migration.join();
}

absl::Status MlaServeService::RefuseIfLeaving() const {
  if (!leaving_.load(std::memory_order_relaxed)) return absl::OkStatus();
  return absl::UnavailableError(
      "this server is leaving its cluster (mlaserve-ctl drain): place new sequences and "
      "prefixes on another server");
}

grpc::ServerUnaryReactor* MlaServeService::Answer(grpc::CallbackServerContext* context,
                                                  absl::string_view rpc, absl::Time start,
                                                  const absl::Status& status) {
  return Finish(context->DefaultReactor(), rpc, start, status);
}

grpc::ServerUnaryReactor* MlaServeService::Finish(grpc::ServerUnaryReactor* reactor,
                                                  absl::string_view rpc, absl::Time start,
                                                  const absl::Status& status) {
  metrics_.RecordRpc(rpc, status.code(), absl::Now() - start);
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

void MlaServeService::StampInstance(grpc::CallbackServerContext* context) const {
  if (!options_.state.instance_id().empty()) {
    context->AddInitialMetadata(kInstanceIdMetadata, options_.state.instance_id());
  }
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
                                                 absl::string_view rpc, int right,
                                                 const grpc::ByteBuffer* request_bytes,
                                                 grpc::ByteBuffer* response_bytes, Handler handle) {
  const absl::Time start = absl::Now();
  StampInstance(context);
  if (!calls_.BeginUnary()) return Refuse(context, rpc, start);
  absl::StatusOr<Tenant*> tenant = Admit(*context, right, rpc);
  if (!tenant.ok()) return Answer(context, rpc, start, tenant.status());
  Request request;
  Response response;
  absl::Status status = ParseWireMessage(*request_bytes, "request", &request);
  if constexpr (requires { ScopeIds(*tenant, request); }) {
    if (status.ok()) status = ScopeIds(*tenant, request);
  }
  if (status.ok()) {
    if constexpr (std::is_invocable_v<Handler, const Request&, Response*, Tenant*>) {
      status = handle(request, &response, *tenant);
    } else {
      status = handle(request, &response);
    }
  }
  if constexpr (requires { response.mutable_sequence(); }) {
    if (status.ok()) UnscopeIds(*tenant, *response.mutable_sequence());
  }
  if (status.ok()) SerializeWireMessage(response, response_bytes);
  return Answer(context, rpc, start, UnscopeStatus(*tenant, status));
}

absl::StatusOr<Tenant*> MlaServeService::Admit(const grpc::CallbackServerContext& context,
                                               int right, absl::string_view rpc) {
  if (options_.tenancy == nullptr) return nullptr;
  ASSIGN_OR_RETURN(Tenant * tenant, options_.tenancy->Authenticate(context));
  RETURN_IF_ERROR(CheckRight(tenant, right, rpc));
  return tenant;
}

grpc::ServerUnaryReactor* MlaServeService::GetServerInfo(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return Unary<v1::GetServerInfoRequest, v1::GetServerInfoResponse>(
      context, "GetServerInfo", kRead, request, response,
      [this](const v1::GetServerInfoRequest&, v1::GetServerInfoResponse* info) {
        *info = MakeServerInfo(engine_.Info(), options_.max_message_bytes);
        *info->mutable_state() = options_.state;
        if (options_.data_planes) {
          for (v1::DataPlane& plane : options_.data_planes()) {
            *info->add_data_planes() = std::move(plane);
          }
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* MlaServeService::RegisterPrefix(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Unary<v1::RegisterPrefixRequest, v1::RegisterPrefixResponse>(
      context, "RegisterPrefix", kWrite, request, response,
      [this](const v1::RegisterPrefixRequest& r, v1::RegisterPrefixResponse*) {
        RETURN_IF_ERROR(RefuseIfLeaving());
        return RegisterPrefixOnEngine(engine_, r);
      });
}

grpc::ServerUnaryReactor* MlaServeService::ReleasePrefix(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return Unary<v1::ReleasePrefixRequest, v1::ReleasePrefixResponse>(
      context, "ReleasePrefix", kWrite, request, response,
      [this](const v1::ReleasePrefixRequest& r, v1::ReleasePrefixResponse*) {
        return engine_.ReleasePrefix(r.prefix_id());
      });
}

grpc::ServerUnaryReactor* MlaServeService::CreateSequence(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Unary<v1::CreateSequenceRequest, v1::CreateSequenceResponse>(
      context, "CreateSequence", kWrite, request, response,
      [this](const v1::CreateSequenceRequest& r, v1::CreateSequenceResponse* created) {
        RETURN_IF_ERROR(RefuseIfLeaving());
        absl::StatusOr<std::optional<KvDtype>> kv_dtype = ParseKvDtype(r.kv_dtype(), "kv_dtype");
        absl::Status status =
            kv_dtype.ok() ? engine_.CreateSequence(r.sequence_id(), r.prefix_id(), *kv_dtype)
                          : kv_dtype.status();
        if (status.ok()) {
          moved_.Forget(r.sequence_id());  // a new sequence under a moved id lives here
          status = DescribeSequence(r.sequence_id(), created->mutable_sequence());
        }
        return status;
      });
}

grpc::ServerUnaryReactor* MlaServeService::ForkSequence(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return Unary<v1::ForkSequenceRequest, v1::ForkSequenceResponse>(
      context, "ForkSequence", kWrite, request, response,
      [this](const v1::ForkSequenceRequest& r, v1::ForkSequenceResponse* forked) {
        RETURN_IF_ERROR(moved_.Check(r.source_sequence_id(), "source_sequence_id"));
        RETURN_IF_ERROR(RefuseIfLeaving());
        absl::Status status = engine_.ForkSequence(r.source_sequence_id(), r.new_sequence_id());
        if (status.ok()) status = DescribeSequence(r.new_sequence_id(), forked->mutable_sequence());
        return status;
      });
}

grpc::ServerUnaryReactor* MlaServeService::ReleaseSequence(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return Unary<v1::ReleaseSequenceRequest, v1::ReleaseSequenceResponse>(
      context, "ReleaseSequence", kWrite, request, response,
      [this](const v1::ReleaseSequenceRequest& r, v1::ReleaseSequenceResponse*) {
        RETURN_IF_ERROR(moved_.Check(r.sequence_id(), "sequence_id"));
        return engine_.ReleaseSequence(r.sequence_id());
      });
}

grpc::ServerUnaryReactor* MlaServeService::GetSequence(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return Unary<v1::GetSequenceRequest, v1::GetSequenceResponse>(
      context, "GetSequence", kRead, request, response,
      [this](const v1::GetSequenceRequest& r, v1::GetSequenceResponse* found) {
        RETURN_IF_ERROR(moved_.Check(r.sequence_id(), "sequence_id"));
        return DescribeSequence(r.sequence_id(), found->mutable_sequence());
      });
}

grpc::ServerUnaryReactor* MlaServeService::ListPrefixes(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return Unary<v1::ListPrefixesRequest, v1::ListPrefixesResponse>(
      context, "ListPrefixes", kRead, request, response,
      [this](const v1::ListPrefixesRequest& r, v1::ListPrefixesResponse* listed, Tenant* tenant) {
        return ListPrefixesOnEngine(engine_, tenant, r, listed);
      });
}

grpc::ServerUnaryReactor* MlaServeService::ListSequences(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return Unary<v1::ListSequencesRequest, v1::ListSequencesResponse>(
      context, "ListSequences", kRead, request, response,
      [this](const v1::ListSequencesRequest& r, v1::ListSequencesResponse* listed, Tenant* tenant) {
        return ListSequencesOnEngine(engine_, tenant, r, listed);
      });
}

grpc::ServerUnaryReactor* MlaServeService::GetStats(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Unary<v1::GetStatsRequest, v1::GetStatsResponse>(
      context, "GetStats", kRead, request, response,
      [this](const v1::GetStatsRequest&, v1::GetStatsResponse* stats, Tenant* tenant) {
        return GetStatsOnEngine(engine_, tenant, options_.tenancy.get(), stats);
      });
}

grpc::ServerUnaryReactor* MlaServeService::MigrateSequences(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request_bytes,
                                                            grpc::ByteBuffer* response_bytes) {
  constexpr absl::string_view kRpc = "MigrateSequences";
  const absl::Time start = absl::Now();
  StampInstance(context);
  if (!calls_.BeginUnary()) return Refuse(context, kRpc, start);
  absl::StatusOr<Tenant*> tenant = Admit(*context, kWrite, kRpc);
  if (!tenant.ok()) return Answer(context, kRpc, start, tenant.status());
  v1::MigrateSequencesRequest request;
  absl::Status status = ParseWireMessage(*request_bytes, "request", &request);
  if (status.ok() && options_.tenancy != nullptr) {
    status = absl::FailedPreconditionError(
        "MigrateSequences: this server has tenants; moving sequences between servers is for "
        "single-tenant servers");
  }
  if (status.ok()) status = ParseHostPort(request.target(), "target").status();
  if (status.ok() && request.leave_cluster() && !options_.leave_cluster) {
    status = absl::FailedPreconditionError("leave_cluster: this server is in no cluster");
  }
  if (status.ok() && request.stop_after() && !options_.stop_server) {
    status = absl::FailedPreconditionError("stop_after: this server cannot stop itself");
  }
  if (!status.ok()) return Answer(context, kRpc, start, status);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::MutexLock lock(&migrations_mu_);
  migrations_.emplace_back([this, kRpc, reactor, start, request = std::move(request),
                            response_bytes] {
    if (request.leave_cluster()) {
      leaving_.store(true);
      options_.leave_cluster();
    }
    std::unique_ptr<client::MlaServeClient> target =
        client::MlaServeClient::Connect(request.target());
    std::vector<std::string> ids(request.sequence_ids().begin(), request.sequence_ids().end());
    absl::StatusOr<MigrationResult> moved = service::MigrateSequences(
        engine_, moved_, *target, request.target(), options_.state.instance_id(), std::move(ids));
    absl::Status result = moved.status();
    if (moved.ok()) {
      v1::MigrateSequencesResponse response;
      response.set_sequences(moved->sequences);
      response.set_prefixes(moved->prefixes);
      response.set_tokens(moved->tokens);
      response.set_bytes(moved->bytes);
      response.set_seconds(absl::ToDoubleSeconds(moved->took));
      response.set_held_seconds(absl::ToDoubleSeconds(moved->held));
      SerializeWireMessage(response, response_bytes);
      spdlog::info("moved {} sequences ({} tokens, {} bytes) to {} in {:.3f} s", moved->sequences,
                   moved->tokens, moved->bytes, request.target(),
                   absl::ToDoubleSeconds(moved->took));
    }
    Finish(reactor, kRpc, start, result);
    if (request.stop_after() && result.ok()) options_.stop_server();
  });
  return reactor;
}

grpc::ServerUnaryReactor* MlaServeService::OpenDataPlane(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return Unary<v1::OpenDataPlaneRequest, v1::OpenDataPlaneResponse>(
      context, "OpenDataPlane", kDecode, request, response,
      [this](const v1::OpenDataPlaneRequest& r, v1::OpenDataPlaneResponse* opened,
             Tenant* tenant) -> absl::Status {
        std::vector<v1::DataPlane> planes;
        if (options_.data_planes && options_.tickets != nullptr) planes = options_.data_planes();
        std::vector<std::string> kinds;
        for (v1::DataPlane& plane : planes) {
          kinds.push_back(plane.kind());
          if (plane.kind() != r.kind()) continue;
          if (plane.version() != r.version()) {
            return absl::FailedPreconditionError(
                absl::StrCat("version: the client speaks ", r.kind(), " data-plane version ",
                             r.version(), "; this server speaks version ", plane.version()));
          }
          opened->set_ticket(options_.tickets->Issue(tenant));
          opened->set_ticket_ttl_s(absl::ToDoubleSeconds(options_.tickets->ttl()));
          *opened->mutable_plane() = std::move(plane);
          opened->set_instance_id(options_.state.instance_id());
          return absl::OkStatus();
        }
        return absl::FailedPreconditionError(absl::StrCat(
            "kind: this server offers no '", r.kind(),
            "' data plane (it offers: ", kinds.empty() ? "none" : absl::StrJoin(kinds, ", "), ")"));
      });
}

grpc::ServerReadReactor<grpc::ByteBuffer>* MlaServeService::AppendKv(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  StampInstance(context);
  absl::StatusOr<Tenant*> admitted = Admit(*context, kWrite, "AppendKv");
  const std::string client = StreamClient(*context, admitted, options_.peer_of);
  return new AppendKvReactor(std::move(admitted), client, engine_, moved_, metrics_, calls_,
                             response);
}

grpc::ServerUnaryReactor* MlaServeService::Decode(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request_bytes,
                                                  grpc::ByteBuffer* response_bytes) {
  const absl::Time start = absl::Now();
  StampInstance(context);
  if (!calls_.BeginUnary()) return Refuse(context, "Decode", start);
  absl::StatusOr<Tenant*> tenant = Admit(*context, kDecode, "Decode");
  if (!tenant.ok()) return Answer(context, "Decode", start, tenant.status());
  // The engine reads the request's tensors in place until it answers.
  auto request = std::make_shared<v1::DecodeRequest>();
  if (absl::Status parsed = ParseWireMessage(*request_bytes, "request", request.get());
      !parsed.ok()) {
    return Answer(context, "Decode", start, parsed);
  }
  absl::StatusOr<std::unique_ptr<ParsedDecode>> call = ParseDecodeRequest(*request);
  if (!call.ok()) return Answer(context, "Decode", start, call.status());
  (*call)->keep_alive = std::move(request);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  dispatcher_.Dispatch(
      *std::move(call), *tenant, CallDeadline(*context),
      [context] { return context->IsCancelled(); },
      [this, reactor, start, response_bytes](absl::StatusOr<AnsweredDecode> answered) {
        absl::Status status = answered.status();
        if (answered.ok()) {
          absl::StatusOr<grpc::ByteBuffer> bytes = WriteDecodeResponse(*answered);
          status = bytes.status();
          if (bytes.ok()) *response_bytes = *std::move(bytes);
        }
        metrics_.RecordRpc("Decode", status.code(), absl::Now() - start);
        reactor->Finish(ToGrpcStatus(status));
        calls_.EndUnary();
      });
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MlaServeService::DecodeStream(
    grpc::CallbackServerContext* context) {
  StampInstance(context);
  absl::StatusOr<Tenant*> admitted = Admit(*context, kDecode, "DecodeStream");
  const std::string client = StreamClient(*context, admitted, options_.peer_of);
  return new DecodeStreamReactor(context, std::move(admitted), client, dispatcher_, metrics_,
                                 calls_, options_.stream_max_in_flight);
}

}  // namespace mlaserve::service
