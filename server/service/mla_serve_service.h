#ifndef MLASERVE_SERVER_SERVICE_MLA_SERVE_SERVICE_H_
#define MLASERVE_SERVER_SERVICE_MLA_SERVE_SERVICE_H_

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "mlaserve/v1/mlaserve.grpc.pb.h"
#include "mlaserve/v1/server_info.pb.h"
#include "server/engine/engine.h"
#include "server/service/call_registry.h"
#include "server/service/data_plane_tickets.h"
#include "server/service/decode_dispatcher.h"
#include "server/service/moved_sequences.h"
#include "server/service/service_metrics.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

struct ServiceOptions {
  // The server's receive limit, reported in GetServerInfo (the builder enforces it).
  int64_t max_message_bytes = int64_t{64} << 20;
  // Requests one DecodeStream may have in the engine before the server stops reading it.
  int stream_max_in_flight = 64;
  // Open streams (DecodeStream and AppendKv) one client may hold over all its connections: a
  // tenant, or a peer address when single-tenant (CallRegistry). 0: no limit.
  int max_streams_per_client = 1024;
  // This start's instance id and what it restored (GetServerInfo.state); the id also goes
  // out as kInstanceIdMetadata on every call's initial metadata.
  v1::StateInfo state;
  // Who the callers are (tenancy.h); null: single-tenant.
  std::shared_ptr<Tenancy> tenancy;
  // MigrateSequences' leave_cluster and stop_after (mlaserve-ctl drain): the process's
  // membership and its SIGTERM path; unset, those requests are FAILED_PRECONDITION.
  std::function<void()> leave_cluster;
  std::function<void()> stop_server;
  // The client's address for a call's gRPC peer (GuardedListener::PeerOf, whose connections
  // gRPC names "fd:N"); unset, the peer as gRPC gives it.
  std::function<std::string(const std::string&)> peer_of;
  // The data planes beside gRPC (GetServerInfo.data_planes), and the tickets OpenDataPlane
  // hands out for them; unset, none.
  std::function<std::vector<v1::DataPlane>()> data_planes;
  DataPlaneTickets* tickets = nullptr;
};

// The initial-metadata key that carries the server's instance id on every call's answer, so
// a client sees a restart (and, from GetServerInfo.state, whether it kept the cache).
inline constexpr char kInstanceIdMetadata[] = "mlaserve-instance-id";

// Every method of mlaserve.v1.MlaServe in its raw form: the service parses requests and
// serializes answers itself (wire_message.h says why).
using RawMlaServe = v1::MlaServe::WithRawCallbackMethod_OpenDataPlane<
    v1::MlaServe::WithRawCallbackMethod_MigrateSequences<
        v1::MlaServe::WithRawCallbackMethod_ListPrefixes<
            v1::MlaServe::WithRawCallbackMethod_ListSequences<
                v1::MlaServe::WithRawCallbackMethod_GetStats<
                    v1::MlaServe::WithRawCallbackMethod_GetServerInfo<
                        v1::MlaServe::WithRawCallbackMethod_RegisterPrefix<
                            v1::MlaServe::WithRawCallbackMethod_ReleasePrefix<
                                v1::MlaServe::WithRawCallbackMethod_CreateSequence<
                                    v1::MlaServe::WithRawCallbackMethod_ForkSequence<
                                        v1::MlaServe::WithRawCallbackMethod_ReleaseSequence<
                                            v1::MlaServe::WithRawCallbackMethod_GetSequence<
                                                v1::MlaServe::WithRawCallbackMethod_AppendKv<
                                                    v1::MlaServe::WithRawCallbackMethod_Decode<
                                                        v1::MlaServe::
                                                            WithRawCallbackMethod_DecodeStream<
                                                                v1::MlaServe::
                                                                    Service>>>>>>>>>>>>>>>;

// mlaserve.v1.MlaServe on gRPC's callback API: no call holds a thread while the engine
// batches it. KV calls run on the callback thread (they are bounded metadata updates and
// copies); Decode is answered from the engine's completion callback. A request that does
// not parse is INVALID_ARGUMENT naming it, in a stream by its index.
class MlaServeService final : public RawMlaServe {
 public:
  MlaServeService(engine::Engine& engine, ServiceMetrics& metrics, ServiceOptions options);
  // Waits for migrations still running.
  ~MlaServeService() override;

  // Open DecodeStreams stop reading and end with UNAVAILABLE once answered, open AppendKv
  // streams end between chunks; new ones are refused. Unary calls are left to
  // Server::Shutdown and the engine's Drain. Returns how many streams were open.
  int BeginDrain() { return calls_.DrainAll(); }
  // True once every call has ended; false if `deadline` came first.
  bool WaitUntilIdle(absl::Time deadline) { return calls_.WaitUntilIdle(deadline); }

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RegisterPrefix(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReleasePrefix(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CreateSequence(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ForkSequence(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReleaseSequence(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetSequence(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Decode(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* AppendKv(grpc::CallbackServerContext* context,
                                                      grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DecodeStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListPrefixes(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListSequences(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  // Runs on a thread of its own (a move takes as long as its rows take to copy).
  grpc::ServerUnaryReactor* MigrateSequences(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* OpenDataPlane(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

  // The path every Decode takes, for the data planes beside gRPC.
  DecodeDispatcher& dispatcher() { return dispatcher_; }

 private:
  // A unary call answered on the callback thread: admits the caller (tenant, `right`),
  // parses the request, moves its ids into the tenant's namespace, runs `handle`
  // (absl::Status(const Request&, Response*), or with the caller's Tenant* as a third
  // argument for handlers that scope ids themselves), brings the answer's ids and status back out,
  // serializes the response if OK.
  template <typename Request, typename Response, typename Handler>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, absl::string_view rpc,
                                  int right, const grpc::ByteBuffer* request_bytes,
                                  grpc::ByteBuffer* response_bytes, Handler handle);
  // The caller's tenant (nullptr when single-tenant) if it may call `rpc`, which needs
  // `right`: UNAUTHENTICATED or PERMISSION_DENIED otherwise.
  absl::StatusOr<Tenant*> Admit(const grpc::CallbackServerContext& context, int right,
                                absl::string_view rpc);
  // Records the call, finishes it with `status` and takes it off the registry.
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, absl::string_view rpc,
                                   absl::Time start, const absl::Status& status);
  // The same for a call answered later, from another thread, on the reactor it returned.
  grpc::ServerUnaryReactor* Finish(grpc::ServerUnaryReactor* reactor, absl::string_view rpc,
                                   absl::Time start, const absl::Status& status);
  // Answers a call that arrives while the server drains (UNAVAILABLE).
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context, absl::string_view rpc,
                                   absl::Time start);
  // The sequence as the engine holds it now.
  absl::Status DescribeSequence(absl::string_view sequence_id, v1::Sequence* sequence) const;
  // Adds the instance id to the call's initial metadata; before the reactor sends anything.
  void StampInstance(grpc::CallbackServerContext* context) const;
  // Once a drain has taken the server out of its cluster, nothing new is created here (a
  // sequence created after the drain's last move would be lost with the server).
  absl::Status RefuseIfLeaving() const;

  engine::Engine& engine_;
  ServiceMetrics& metrics_;
  const ServiceOptions options_;
  MovedSequences moved_;
  std::atomic<bool> leaving_{false};
  DecodeDispatcher dispatcher_;
  CallRegistry calls_;
  absl::Mutex migrations_mu_;
  std::vector<std::thread> migrations_ ABSL_GUARDED_BY(migrations_mu_);
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_MLA_SERVE_SERVICE_H_
