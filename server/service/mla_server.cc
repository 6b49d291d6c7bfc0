#include "server/service/mla_server.h"

#include <algorithm>
#include <exception>
#include <future>
#include <limits>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host_id.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "kernels/core/tensor_view.h"
#include "openssl/ssl.h"
#include "server/dataplane/data_plane_stats_collector.h"
#include "server/engine/owned_decode_query.h"
#include "server/service/guard_stats_collector.h"
#include "server/service/pem_credentials.h"
#include "spdlog/spdlog.h"

namespace mlaserve::service {
namespace {

constexpr char kServiceName[] = "mlaserve.v1.MlaServe";
constexpr char kWarmUpSequence[] = "__mlaserve_warmup__";

int Milliseconds(absl::Duration d) {
  return static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, std::numeric_limits<int>::max()));
}

void ApplyConnectionLimits(const ServerOptions& options, grpc::ServerBuilder& builder) {
  // gRPC's default SO_REUSEPORT lets a second server bind a port already served, and the
  // kernel then splits connections between the two: sequences would seem to vanish.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::ResourceQuota quota("mlaserve");
  quota.Resize(static_cast<size_t>(options.grpc_memory_bytes));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_streams_per_connection);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             Milliseconds(options.keepalive_timeout));
  // Clients may keep their own keepalives on idle channels, at most one ping per 10 s.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             Milliseconds(options.max_connection_idle));
  if (options.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               Milliseconds(options.max_connection_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               Milliseconds(options.max_connection_age_grace));
  }
}

// 128 random bits: unique per start, so clients can tell restarts apart.
std::string NewInstanceId() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

}  // namespace

absl::Status MlaServer::StartUcxPlane(const ServerOptions& options, MlaServer& server) {
  // UCX moves bytes in the clear (RDMA or TCP): a server whose gRPC port is TLS must not
  // offer its callers' queries and answers unencrypted unless the operator says the fabric
  // is private.
  if (options.tls.enabled() && !options.data_plane_ucx_trusted_fabric) {
    return absl::FailedPreconditionError(
        "--data_plane_ucx: UCX does not encrypt, and this server serves gRPC with TLS "
        "(--tls_cert); start it with --data_plane_ucx_trusted_fabric if nobody else can read "
        "the fabric between the hosts, or turn the plane off (--data_plane_ucx=off)");
  }
  ASSIGN_OR_RETURN(const HostPort where, ParseHostPort(options.data_plane_ucx, "--data_plane_ucx"));
  dataplane::UcxDataPlaneOptions plane;
  plane.host = where.host;
  plane.port = where.port;
  plane.caps = options.data_plane_ucx_caps;
  plane.instance_id = server.state_.instance_id();
  plane.host_id = HostId();
  ASSIGN_OR_RETURN(server.ucx_plane_,
                   dataplane::UcxDataPlane::Start(std::move(plane), server.service_->dispatcher(),
                                                  *server.tickets_, *server.metrics_));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MlaServer>> MlaServer::Start(EngineFactory factory,
                                                            engine::EngineOptions engine_options,
                                                            const ServerOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(options.tls));
  std::unique_ptr<MlaServer> server(new MlaServer());
  server->metrics_ = std::make_unique<ServiceMetrics>();
  ServiceMetrics* metrics = server->metrics_.get();
  MlaServer* self = server.get();
  engine_options.on_batch = [metrics, self, chained = std::move(engine_options.on_batch)](
                                const engine::BatchReport& report) {
    metrics->RecordBatch(report);
    if (!report.status.ok()) self->CheckDevices();
    if (chained) chained(report);
  };
  ASSIGN_OR_RETURN(server->engine_, factory(std::move(engine_options)));
  metrics->AddDevices(static_cast<int>(server->engine_->Info().devices.size()));

  // The saved state is in the store before anyone can call.
  server->state_.set_instance_id(NewInstanceId());
  server->snapshot_interval_ = options.snapshot_interval;
  if (!options.state_dir.empty()) {
    server->state_keeper_ = std::make_unique<state::KvStateKeeper>(
        *server->engine_, options.state_dir, server->state_.instance_id(),
        server->engine_->Info().model.name);
    if (const std::optional<state::KvStateFileInfo> restored = server->state_keeper_->Restore()) {
      server->state_.set_restored_from_instance_id(restored->instance_id);
      server->state_.set_restored_prefixes(restored->prefixes);
      server->state_.set_restored_sequences(restored->sequences);
    }
    server->state_.set_state_dir(options.state_dir);
    server->state_.set_snapshot_interval_s(absl::ToDoubleSeconds(options.snapshot_interval));
  }

  ServiceOptions service_options;
  service_options.state = server->state_;
  server->tenancy_ = options.tenancy;
  if (options.tenancy != nullptr && options.tenancy->mode() != Tenancy::Mode::kSingleTenant) {
    service_options.tenancy = options.tenancy;
  }
  service_options.max_message_bytes = options.max_message_bytes;
  service_options.stream_max_in_flight = options.stream_max_in_flight;
  service_options.max_streams_per_client = options.max_streams_per_client;
  service_options.leave_cluster = options.leave_cluster;
  service_options.stop_server = options.stop_server;
  // Only the listener's connections reach gRPC once it owns the port, and it outlives them.
  // A unix socket's clients are local processes, admitted by the file's permissions.
  const bool guarded = options.http2_guard && !absl::StartsWith(options.listen_address, "unix:");
  if (guarded) {
    service_options.peer_of = [self](const std::string& peer) {
      return self->listener_ != nullptr ? self->listener_->PeerOf(peer) : peer;
    };
  }
  server->stop_server_ = options.stop_server;
  server->tickets_ = std::make_unique<DataPlaneTickets>();
  service_options.tickets = server->tickets_.get();
  service_options.data_planes = [self] {
    std::vector<v1::DataPlane> planes;
    if (self->shm_plane_ != nullptr) planes.push_back(self->shm_plane_->Advertised());
    if (self->ucx_plane_ != nullptr) planes.push_back(self->ucx_plane_->Advertised());
    return planes;
  };
  server->service_ = std::make_unique<MlaServeService>(*server->engine_, *metrics, service_options);
  if (!options.data_plane_socket.empty()) {
    dataplane::ShmDataPlaneOptions plane;
    plane.address = options.data_plane_socket;
    plane.caps = options.data_plane_caps;
    plane.poll = options.data_plane_poll;
    plane.instance_id = server->state_.instance_id();
    plane.host_id = HostId();
    plane.map_for_devices = [engine = server->engine_.get()](const void* data, uint64_t bytes) {
      return engine->MapHostMemory(data, static_cast<int64_t>(bytes));
    };
    ASSIGN_OR_RETURN(
        server->shm_plane_,
        dataplane::ShmDataPlane::Start(std::move(plane), server->service_->dispatcher(),
                                       *server->tickets_, *metrics, server->engine_->Info().model));
  }

  if (!options.data_plane_ucx.empty()) {
    RETURN_IF_ERROR(StartUcxPlane(options, *server));
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Behind the guard, TLS ends in its relay and gRPC serves plaintext socket pairs.
  if (!guarded) builder.AddListeningPort(options.listen_address, credentials, &server->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(options.max_message_bytes, std::numeric_limits<int>::max())));
  ApplyConnectionLimits(options, builder);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (guarded && server->server_ != nullptr) {
    listener::GuardedListenerOptions listen;
    listen.address = options.listen_address;
    listen.limits = options.guard_limits;
    listen.limits.max_message_bytes = options.max_message_bytes;
    listen.relay_threads = options.guard_threads;
    if (options.tls.enabled()) {
      ASSIGN_OR_RETURN(server->guard_credentials_, PemCredentials::Load(options.tls));
      PemCredentials* pem = server->guard_credentials_.get();
      listen.configure_tls = [pem](SSL_CTX* ctx) {
        // The certificate is chosen per handshake, so a renewal reaches new connections.
        SSL_CTX_set_cert_cb(ctx, &PemCredentials::CertificateCallback, pem);
        if (pem->mutual()) {
          SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
        }
        return true;
      };
    }
    ASSIGN_OR_RETURN(server->listener_,
                     listener::GuardedListener::Start(*server->server_, std::move(listen)));
    server->port_ = server->listener_->port();
    if (options.tls.enabled() && options.tenancy != nullptr) {
      listener::GuardedListener* guard = server->listener_.get();
      options.tenancy->set_certificate_name_of(
          [guard](const std::string& peer) { return guard->CommonNameOf(peer); });
    }
  }
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address));
  }
  server->SetServing(false);

  if (!options.metrics_address.empty()) {
    server->stats_collector_ =
        std::make_shared<EngineStatsCollector>(*server->engine_, server->tenancy_.get());
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables{metrics->registry(),
                                                                       server->stats_collector_};
    if (server->listener_ != nullptr) {
      collectables.push_back(std::make_shared<GuardStatsCollector>(*server->listener_));
    }
    if (server->shm_plane_ != nullptr || server->ucx_plane_ != nullptr) {
      collectables.push_back(std::make_shared<dataplane::DataPlaneStatsCollector>(
          server->shm_plane_.get(), server->ucx_plane_.get()));
    }
    ASSIGN_OR_RETURN(
        server->metrics_endpoint_,
        MetricsEndpoint::Start(options.metrics_address, options.tls, std::move(collectables)));
    server->metrics_port_ = server->metrics_endpoint_->port();
  }
  if (options.heap_release_interval > absl::ZeroDuration()) {
    server->heap_releaser_ = std::make_unique<HeapReleaser>(
        options.heap_release_interval,
        [metrics](absl::Duration took) { metrics->RecordHeapRelease(took); });
  }
  return server;
}

MlaServer::~MlaServer() {
  if (!shut_down_ && server_ != nullptr) Shutdown(absl::ZeroDuration()).IgnoreError();
}

void MlaServer::CheckDevices() {
  const absl::Status health = engine_->Health();
  if (health.ok() || fault_reported_.exchange(true)) return;
  {
    std::lock_guard lock(fault_mu_);
    fault_ = health;
  }
  // Nothing computed after the fault is trusted: stop serving, and stop the process (its unit
  // restarts it, on a device that works again or not at all).
  spdlog::error("device fault, serving stops and the server drains: {}",
                std::string(health.message()));
  SetServing(false);
  if (stop_server_) stop_server_();
}

absl::Status MlaServer::fault() const {
  std::lock_guard lock(fault_mu_);
  return fault_;
}

void MlaServer::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceName, serving);
  if (serving && state_keeper_ != nullptr && snapshot_interval_ > absl::ZeroDuration() &&
      !periodic_saves_started_) {
    periodic_saves_started_ = true;
    state_keeper_->StartPeriodicSaves(snapshot_interval_);
  }
}

absl::Status MlaServer::WarmUp() {
  const engine::ModelConfig& model = engine_->Info().model;
  // A few tokens of small, distinct values: enough for every kernel path to run.
  constexpr int kTokens = 8;
  std::vector<Bf16> rows(static_cast<size_t>(kTokens) * model.dk_latent());
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = Bf16::FromFloat(static_cast<float>(i % 7) * 0.125f - 0.375f);
  }
  using RowsView = TensorView<const Bf16, 2>;
  const RowsView::Index shape{kTokens, model.dk_latent()};
  ASSIGN_OR_RETURN(RowsView view, RowsView::Create(rows, shape, "warm-up rows"));
  RETURN_IF_ERROR(engine_->CreateSequence(kWarmUpSequence, "", std::nullopt));
  absl::Status status = engine_->AppendKv(kWarmUpSequence, 0, 0, view);
  // One query per call: the engine takes a sequence layer once per call.
  for (const engine::QuerySpace space : {engine::QuerySpace::kHead, engine::QuerySpace::kLatent}) {
    if (!status.ok()) break;
    engine::OwnedDecodeQuery query;
    query.sequence_id = kWarmUpSequence;
    query.space = space;
    if (space == engine::QuerySpace::kHead) {
      query.q_nope.assign(static_cast<size_t>(model.heads) * model.dn, Bf16::FromFloat(0.25f));
      query.q_pe.assign(static_cast<size_t>(model.heads) * model.dr, Bf16::FromFloat(0.25f));
    } else {
      query.q_latent.assign(static_cast<size_t>(model.heads) * model.dk_latent(),
                            Bf16::FromFloat(0.25f));
    }
    std::promise<absl::Status> answered;
    engine_->Decode({query.View(model)}, engine::DecodeOptions{},
                    [&answered](absl::StatusOr<std::span<const engine::DecodeAnswer>> answers) {
                      answered.set_value(answers.status());
                    });
    status = answered.get_future().get();
  }
  const absl::Status released = engine_->ReleaseSequence(kWarmUpSequence);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("warm-up decode: ", status.message()));
  }
  return released;
}

absl::Status MlaServer::Shutdown(absl::Duration timeout) {
  if (shut_down_) return absl::OkStatus();
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + timeout;
  // No new connections; open ones stay relayed while their calls finish.
  if (listener_ != nullptr) listener_->StopAccepting();
  server_->GetHealthCheckService()->Shutdown();
  if (shm_plane_ != nullptr) shm_plane_->Drain();
  if (ucx_plane_ != nullptr) ucx_plane_->Drain();
  const int streams = service_->BeginDrain();
  // What the drain cuts, so that "drained cleanly" is not the only word on it.
  if (streams > 0) {
    spdlog::info(
        "draining: {} open stream(s) asked to end (DecodeStreams once their requests "
        "are answered, AppendKv streams between chunks; their clients get UNAVAILABLE)",
        streams);
  }
  // Calls in flight finish (until the deadline); then connections still open are closed at
  // once, after a moment for the last answers to leave: gRPC would otherwise wait for every
  // idle client to hang up, up to the deadline.
  constexpr absl::Duration kFlushGrace = absl::Milliseconds(100);
  const bool idle = service_->WaitUntilIdle(deadline);
  server_->Shutdown(
      absl::ToChronoTime(idle ? std::min(deadline, absl::Now() + kFlushGrace) : deadline));
  const absl::Status drained = engine_->Drain(deadline);
  metrics_endpoint_.reset();
  shm_plane_.reset();  // after the endpoint, whose scrapes read it; its calls ended with the drain
  ucx_plane_.reset();  // likewise; it sends the answers the drain wrote before it closes
  listener_.reset();   // after the endpoint, whose scrapes read it
  if (state_keeper_ == nullptr) return drained;
  // Nothing changes the store any more: this save is the state the next start resumes.
  const absl::Time save_start = absl::Now();
  absl::StatusOr<state::KvStateFileInfo> saved = state_keeper_->Save();
  if (!saved.ok()) {
    spdlog::error("state: cannot save the KV state: {}", std::string(saved.status().message()));
    return drained.ok() ? saved.status() : drained;
  }
  spdlog::info(
      "state: saved {} sequence(s), {} prefix(es), {} tokens ({:.1f} MiB) to {} in {:.2f} s",
      saved->sequences, saved->prefixes, saved->tokens,
      static_cast<double>(saved->bytes) / (1 << 20), state_keeper_->path(),
      absl::ToDoubleSeconds(absl::Now() - save_start));
  return drained;
}

}  // namespace mlaserve::service
