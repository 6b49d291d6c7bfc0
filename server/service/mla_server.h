#ifndef MLASERVE_SERVER_SERVICE_MLA_SERVER_H_
#define MLASERVE_SERVER_SERVICE_MLA_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "prometheus/exposer.h"
#include "server/engine/engine.h"
#include "server/service/engine_stats_collector.h"
#include "server/service/mla_serve_service.h"
#include "server/service/service_metrics.h"

namespace mlaserve::service {

struct ServerOptions {
  // host:port to serve gRPC on; port 0 picks a free one (see MlaServer::port()).
  std::string listen_address = "127.0.0.1:50051";
  // host:port for Prometheus' /metrics; empty for none; port 0 picks a free one.
  std::string metrics_address = "127.0.0.1:9464";
  // Largest request message accepted. Bounded (unlike Triton's INT32_MAX) so a single
  // request cannot make the server allocate without limit; long prompts use AppendKv.
  int64_t max_message_bytes = int64_t{64} << 20;
  int stream_max_in_flight = 64;
};

// The whole server in one object, for main and for in-process tests: the engine (with its
// batch reports feeding the metrics), the MlaServe service, grpc.health.v1 and reflection,
// and the Prometheus endpoint. Health stays NOT_SERVING until SetServing(true).
class MlaServer {
 public:
  using EngineFactory =
      absl::AnyInvocable<absl::StatusOr<std::unique_ptr<engine::Engine>>(engine::EngineOptions)>;

  // Creates the engine with `factory` (CreateEngine, or a test's) and starts listening.
  // UNAVAILABLE if an address cannot be bound; the factory's error otherwise.
  static absl::StatusOr<std::unique_ptr<MlaServer>> Start(EngineFactory factory,
                                                          engine::EngineOptions engine_options,
                                                          const ServerOptions& options);

  MlaServer(const MlaServer&) = delete;
  MlaServer& operator=(const MlaServer&) = delete;
  // Shuts down at once if Shutdown was not called.
  ~MlaServer();

  int port() const { return port_; }
  // 0 without a metrics endpoint.
  int metrics_port() const { return metrics_port_; }
  engine::Engine& engine() { return *engine_; }
  const ServiceMetrics& metrics() const { return *metrics_; }

  // Runs a head-space and a latent decode on a scratch sequence, so the first client does
  // not pay for first-touch costs, and checks the engine answers at all.
  absl::Status WarmUp();

  // grpc.health.v1 status of the server ("") and of mlaserve.v1.MlaServe.
  void SetServing(bool serving);

  // Graceful stop: health NOT_SERVING for good, DecodeStreams end once answered, no new
  // calls, in-flight calls run until `timeout` (then they are cancelled), then the engine
  // drains. Returns the engine's Drain status (DEADLINE_EXCEEDED if work was cut short).
  // Later calls do nothing.
  absl::Status Shutdown(absl::Duration timeout);

 private:
  MlaServer() = default;

  // Destruction runs bottom-up: the endpoints go before the engine they read, the engine
  // (whose batch reports the metrics receive) before the metrics.
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<MlaServeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<EngineStatsCollector> stats_collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  int metrics_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_MLA_SERVER_H_
