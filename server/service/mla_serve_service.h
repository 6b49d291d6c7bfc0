#ifndef MLASERVE_SERVER_SERVICE_MLA_SERVE_SERVICE_H_
#define MLASERVE_SERVER_SERVICE_MLA_SERVE_SERVICE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_callback.h"
#include "mlaserve/v1/mlaserve.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/service/decode_dispatcher.h"
#include "server/service/service_metrics.h"
#include "server/service/stream_registry.h"

namespace mlaserve::service {

struct ServiceOptions {
  // The server's receive limit, reported in GetServerInfo (the builder enforces it).
  int64_t max_message_bytes = int64_t{64} << 20;
  // Requests one DecodeStream may have in the engine before the server stops reading it.
  int stream_max_in_flight = 64;
};

// mlaserve.v1.MlaServe on gRPC's callback API: no call holds a thread while the engine
// batches it. KV calls run on the callback thread (they are bounded metadata updates and
// copies); Decode is answered from the engine's completion callback.
class MlaServeService final : public v1::MlaServe::CallbackService {
 public:
  MlaServeService(engine::Engine& engine, ServiceMetrics& metrics, ServiceOptions options);

  // Open DecodeStreams stop reading and end with UNAVAILABLE once answered; new ones are
  // refused. Unary calls are left to Server::Shutdown and the engine's Drain.
  void BeginDrain() { streams_.DrainAll(); }

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* RegisterPrefix(grpc::CallbackServerContext* context,
                                           const v1::RegisterPrefixRequest* request,
                                           v1::RegisterPrefixResponse* response) override;
  grpc::ServerUnaryReactor* ReleasePrefix(grpc::CallbackServerContext* context,
                                          const v1::ReleasePrefixRequest* request,
                                          v1::ReleasePrefixResponse* response) override;
  grpc::ServerUnaryReactor* CreateSequence(grpc::CallbackServerContext* context,
                                           const v1::CreateSequenceRequest* request,
                                           v1::CreateSequenceResponse* response) override;
  grpc::ServerUnaryReactor* ForkSequence(grpc::CallbackServerContext* context,
                                         const v1::ForkSequenceRequest* request,
                                         v1::ForkSequenceResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseSequence(grpc::CallbackServerContext* context,
                                            const v1::ReleaseSequenceRequest* request,
                                            v1::ReleaseSequenceResponse* response) override;
  grpc::ServerUnaryReactor* GetSequence(grpc::CallbackServerContext* context,
                                        const v1::GetSequenceRequest* request,
                                        v1::GetSequenceResponse* response) override;
  grpc::ServerReadReactor<v1::AppendKvChunk>* AppendKv(grpc::CallbackServerContext* context,
                                                       v1::AppendKvResponse* response) override;
  grpc::ServerUnaryReactor* Decode(grpc::CallbackServerContext* context,
                                   const v1::DecodeRequest* request,
                                   v1::DecodeResponse* response) override;
  grpc::ServerBidiReactor<v1::DecodeStreamRequest, v1::DecodeStreamResponse>* DecodeStream(
      grpc::CallbackServerContext* context) override;

 private:
  // Records the call and finishes it with `status`.
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, absl::string_view rpc,
                                   absl::Time start, const absl::Status& status);
  // The sequence as the engine holds it now.
  absl::Status DescribeSequence(absl::string_view sequence_id, v1::Sequence* sequence) const;

  engine::Engine& engine_;
  ServiceMetrics& metrics_;
  const ServiceOptions options_;
  DecodeDispatcher dispatcher_;
  StreamRegistry streams_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_MLA_SERVE_SERVICE_H_
