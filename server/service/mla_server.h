#ifndef MLASERVE_SERVER_SERVICE_MLA_SERVER_H_
#define MLASERVE_SERVER_SERVICE_MLA_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/heap_releaser.h"
#include "grpcpp/server.h"
#include "server/dataplane/byte_budget.h"
#include "server/dataplane/shm_data_plane.h"
#include "server/dataplane/ucx_data_plane.h"
#include "server/engine/engine.h"
#include "server/listener/guarded_listener.h"
#include "server/listener/http2_guard_limits.h"
#include "server/service/engine_stats_collector.h"
#include "server/service/metrics_endpoint.h"
#include "server/service/mla_serve_service.h"
#include "server/service/pem_credentials.h"
#include "server/service/service_metrics.h"
#include "server/service/transport_security.h"
#include "server/state/kv_state_keeper.h"

namespace mlaserve::service {

struct ServerOptions {
  // host:port to serve gRPC on; port 0 picks a free one (see MlaServer::port()).
  std::string listen_address = "127.0.0.1:50051";
  // host:port for Prometheus' /metrics; empty for none; port 0 picks a free one.
  std::string metrics_address = "127.0.0.1:9464";
  // TLS or mutual TLS on the gRPC port; plaintext when no certificate is given.
  TlsOptions tls;
  // Largest request message accepted. Bounded (unlike Triton's INT32_MAX) so a single
  // request cannot make the server allocate without limit; long prompts use AppendKv.
  int64_t max_message_bytes = int64_t{64} << 20;
  int stream_max_in_flight = 64;

  // Connection hygiene (docs/deploy.md, "Connections"). Memory gRPC may hold for requests
  // being received and answers being sent, over all connections: past it gRPC stops reading
  // and closes the connection holding the most (a 1 GB body or a stream-reset flood then
  // costs this much, not what the client sends).
  int64_t grpc_memory_bytes = int64_t{1} << 30;
  // Streams one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
  int max_streams_per_connection = 256;
  // Open streams one client may hold over all its connections (ServiceOptions); 0: no limit.
  int max_streams_per_client = 1024;
  // The server pings a connection idle this long and closes it if no answer comes within
  // keepalive_timeout, so a vanished client's streams do not linger.
  absl::Duration keepalive_time = absl::Seconds(60);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // A connection with no call for this long is closed (clients reconnect transparently).
  absl::Duration max_connection_idle = absl::Minutes(30);
  // Connections older than this are asked to reconnect (0: never), with a grace period for
  // the calls they carry; spreads clients over replicas and bounds any one connection's life.
  absl::Duration max_connection_age = absl::ZeroDuration();
  absl::Duration max_connection_age_grace = absl::Seconds(30);
  // The HTTP/2 guard in front of gRPC (docs/deploy.md, "HTTP/2 guard"): mlaserve owns the
  // listening socket, ends TLS itself if configured, and relays each connection to gRPC
  // through an Http2Guard that ends rapid-reset floods and refuses messages by their declared
  // length (its max_message_bytes is max_message_bytes above). Off, or on a unix socket,
  // gRPC listens itself.
  bool http2_guard = true;
  listener::Http2GuardLimits guard_limits;
  int guard_threads = 1;

  // Who the callers are (tenancy.h): set by the command line; null is single-tenant. Its KV
  // quotas must also be in the engine options (KvStoreOptions::namespace_budget_bytes).
  std::shared_ptr<Tenancy> tenancy;

  // MigrateSequences' leave_cluster and stop_after (ServiceOptions).
  std::function<void()> leave_cluster;
  std::function<void()> stop_server;

  // Restarts that keep the cache (docs/deploy.md): the KV store is loaded from this directory
  // before the server listens and saved there after a drain; "" keeps no state.
  std::string state_dir;
  // Also saved this often while serving (0: only on a drain), so a kill -9 loses at most this.
  absl::Duration snapshot_interval = absl::ZeroDuration();

  // Freed memory is handed back to the kernel this often (HeapReleaser; 0: never), so RSS
  // follows the memory in use instead of what the allocator's arenas once held.
  absl::Duration heap_release_interval = absl::Seconds(60);

  // The same-host data plane (docs/deploy.md, "Data planes"): its unix socket (a path, or
  // "@name" for an abstract one; "" for none), the caps on the memory clients register, and
  // how long its poller keeps scanning after a call before it sleeps.
  std::string data_plane_socket;
  dataplane::ByteBudget::Caps data_plane_caps = dataplane::kDefaultRegionCaps;
  absl::Duration data_plane_poll = absl::ZeroDuration();
  // The cross-host data plane on UCX (docs/deploy.md, "Data planes"): where its listener
  // binds ("" for none: off by default), the caps on the bytes of calls in flight. UCX does
  // not encrypt: with TLS the server starts it only when the fabric is trusted.
  std::string data_plane_ucx;  // HOST:PORT
  dataplane::ByteBudget::Caps data_plane_ucx_caps = dataplane::kDefaultUcxCallCaps;
  bool data_plane_ucx_trusted_fabric = false;
};

// The whole server in one object, for main and for in-process tests: the engine (with its
// batch reports feeding the metrics), the MlaServe service, grpc.health.v1 and reflection,
// and the Prometheus endpoint. Health stays NOT_SERVING until SetServing(true).
class MlaServer {
 public:
  using EngineFactory =
      absl::AnyInvocable<absl::StatusOr<std::unique_ptr<engine::Engine>>(engine::EngineOptions)>;

  // Creates the engine with `factory` (CreateEngine, or a test's), restores the saved KV
  // state if `options.state_dir` is set, and starts listening.
  // UNAVAILABLE if an address cannot be bound (also when another server holds the port:
  // the listener does not share ports); INVALID_ARGUMENT naming the flag for unusable TLS
  // files; the factory's error otherwise.
  static absl::StatusOr<std::unique_ptr<MlaServer>> Start(EngineFactory factory,
                                                          engine::EngineOptions engine_options,
                                                          const ServerOptions& options);

  MlaServer(const MlaServer&) = delete;
  MlaServer& operator=(const MlaServer&) = delete;
  // Shuts down at once if Shutdown was not called.
  ~MlaServer();

  int port() const { return port_; }
  // The HTTP/2 guard's listener; null when gRPC listens itself (guard off, or TLS).
  const listener::GuardedListener* guard() const { return listener_.get(); }
  // 0 without a metrics endpoint.
  int metrics_port() const { return metrics_port_; }
  // "HTTP", "HTTPS" or "HTTPS with client certificates": the gRPC port's security.
  const char* metrics_mode() const {
    return metrics_endpoint_ != nullptr ? metrics_endpoint_->mode() : "disabled";
  }
  engine::Engine& engine() { return *engine_; }
  // The same-host data plane; null when it is off.
  const dataplane::ShmDataPlane* shm_plane() const { return shm_plane_.get(); }
  // The UCX data plane; null when it is off.
  const dataplane::UcxDataPlane* ucx_plane() const { return ucx_plane_.get(); }
  const ServiceMetrics& metrics() const { return *metrics_; }

  // Runs a head-space and a latent decode on a scratch sequence, so the first client does
  // not pay for first-touch costs, and checks the engine answers at all.
  absl::Status WarmUp();

  // grpc.health.v1 status of the server ("") and of mlaserve.v1.MlaServe. The first
  // SetServing(true) also starts the periodic KV state saves, if configured.
  void SetServing(bool serving);

  // OK, or the device fault that stopped the server serving (and asked it to stop).
  absl::Status fault() const;

  // This start's instance id and the KV state it restored (GetServerInfo.state).
  const v1::StateInfo& state() const { return state_; }

  // Graceful stop: health NOT_SERVING for good, DecodeStreams end once answered, no new
  // calls, in-flight calls run until `timeout` (then they are cancelled), then the engine
  // drains, then the KV state is saved to the state directory, if any. Returns the engine's
  // Drain status (DEADLINE_EXCEEDED if work was cut short) or the save's error. Later calls
  // do nothing.
  absl::Status Shutdown(absl::Duration timeout);

 private:
  MlaServer() = default;
  // The UCX plane on options.data_plane_ucx, refused under TLS unless the fabric is trusted
  // (FAILED_PRECONDITION naming the flags).
  static absl::Status StartUcxPlane(const ServerOptions& options, MlaServer& server);
  // After a failed batch: if a device is out of service, health NOT_SERVING and the server
  // stops (ServerOptions::stop_server), once.
  void CheckDevices();

  // Destruction runs bottom-up: the endpoints go before the engine they read, the engine
  // (whose batch reports the metrics receive) before the metrics.
  std::unique_ptr<ServiceMetrics> metrics_;
  std::shared_ptr<Tenancy> tenancy_;  // the service and the metrics read it
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<state::KvStateKeeper> state_keeper_;  // reads the engine
  v1::StateInfo state_;
  absl::Duration snapshot_interval_;
  bool periodic_saves_started_ = false;
  std::function<void()> stop_server_;
  std::atomic<bool> fault_reported_{false};
  mutable std::mutex fault_mu_;
  absl::Status fault_;                         // guarded by fault_mu_
  std::unique_ptr<DataPlaneTickets> tickets_;  // the service hands them out
  std::unique_ptr<MlaServeService> service_;
  std::unique_ptr<dataplane::ShmDataPlane> shm_plane_;  // calls the service's dispatcher
  std::unique_ptr<dataplane::UcxDataPlane> ucx_plane_;  // likewise
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<PemCredentials> guard_credentials_;    // TLS files for the guard's relay
  std::unique_ptr<listener::GuardedListener> listener_;  // null: gRPC listens itself
  std::shared_ptr<EngineStatsCollector> stats_collector_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  std::unique_ptr<HeapReleaser> heap_releaser_;  // reports to the metrics
  int port_ = 0;
  int metrics_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_MLA_SERVER_H_
