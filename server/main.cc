// mlaserve-server: decode attention for MLA models over gRPC.
//
// Lifecycle, one log line each: start, listening, ready (after warm-up: health SERVING and
// systemd READY=1), draining (on SIGTERM/SIGINT: health NOT_SERVING, STOPPING=1, no new
// calls, in-flight ones finish within --drain_timeout_s), stopped (exit 0).

#include <pthread.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include <systemd/sd-daemon.h>

#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/etcd_client.h"
#include "common/serving_allocator.h"
#include "grpcpp/security/credentials.h"
#include "kernels/core/cpu_features.h"
#include "kernels/core/matmul.h"
#include "server/cluster/advertise_address.h"
#include "server/cluster/cluster_membership.h"
#include "server/cluster/member_description.h"
#include "server/engine/engine.h"
#include "server/server_flags.h"
#include "server/service/mla_server.h"
#include "spdlog/spdlog.h"

namespace {

pthread_t main_thread;

// Threads started before main() do not block the shutdown signals: OpenBLAS's pthread
// build starts its pool from a library constructor. The kernel may hand a SIGTERM for the
// process to one of them, where the default action would end the process undrained (exit
// by signal, e.g. a stop while warming up); this handler passes it on to the main thread.
void ForwardToMainThread(int signal) {
  const int saved_errno = errno;
  pthread_kill(main_thread, signal);
  errno = saved_errno;
}

// Signals are taken synchronously with sigwait on the main thread, so nothing the server
// does runs in a handler; every thread inherits this mask, hence blocking them first.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  main_thread = pthread_self();
  struct sigaction forward = {};
  forward.sa_handler = ForwardToMainThread;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &forward, nullptr);
  sigaction(SIGINT, &forward, nullptr);
  return signals;
}

}  // namespace

int main(int argc, char** argv) {
  const sigset_t shutdown_signals = BlockShutdownSignals();
  mlaserve::TuneAllocatorForServing();
  absl::SetProgramUsageMessage(
      "Serves MLA decode attention over gRPC (mlaserve.v1.MlaServe).\n"
      "Flag names take dashes or underscores; --flagfile=PATH reads flags from a file.");
  absl::StatusOr<mlaserve::ServerConfig> config = mlaserve::ParseServerCommandLine(argc, argv);
  if (!config.ok()) {
    spdlog::error("{}", std::string(config.status().message()));
    return EXIT_FAILURE;
  }
  spdlog::set_level(config->log_level);
  if (const absl::Status cpu = mlaserve::CheckBuildRunsOnThisCpu(); !cpu.ok()) {
    spdlog::error("{}", std::string(cpu.message()));
    return EXIT_FAILURE;
  }
  const mlaserve::engine::EngineOptions& engine = config->engine;
  spdlog::info(
      "starting: model {} ({} layer{}, {} heads, scale {:.7f}), {}, "
      "KV budget {} in {}-token pages, {} by default, max batch {}, max wait {} us; host {} "
      "({} cores, {}), matrix unit on {}",
      engine.model.name, engine.model.layers, engine.model.layers == 1 ? "" : "s",
      engine.model.heads, engine.model.softmax_scale,
      engine.gpu.empty() ? absl::StrCat(engine.devices, " x ", engine.profile, " device(s)")
                         : engine.gpu,
      engine.kv.budget_bytes > 0 ? absl::StrCat(engine.kv.budget_bytes >> 20, " MiB")
                                 : std::string("auto"),
      engine.kv.page_size, mlaserve::KvDtypeName(engine.kv.default_kv_dtype), engine.max_batch,
      absl::ToInt64Microseconds(engine.max_wait), mlaserve::HostCpu().model,
      mlaserve::HostCpu().logical_cores, mlaserve::HostCpu().MatrixIsa(),
      mlaserve::MatrixUnitBackend());
  if (engine.gpu.empty() && !engine.sizing.rule.empty()) {
    const auto level = engine.sizing.oversubscribed ? spdlog::level::warn : spdlog::level::info;
    spdlog::log(level, "pool: {} device(s) x {} host thread(s){}; {}", engine.devices,
                engine.host_threads_per_device,
                engine.sizing.oversubscribed ? ", more threads than usable CPUs" : "",
                engine.sizing.rule);
  }

  // TLS files towards etcd are read before anything starts, so that a bad one stops the
  // start naming its flag.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> etcd_credentials =
      mlaserve::cluster::EtcdChannelCredentials(config->etcd_ca_file, config->etcd_cert_file,
                                                config->etcd_key_file);
  if (!etcd_credentials.ok()) {
    spdlog::error("{}", std::string(etcd_credentials.status().message()));
    return EXIT_FAILURE;
  }

  // MigrateSequences' leave_cluster and stop_after (mlaserve-ctl drain): the membership,
  // once joined, and the SIGTERM path below.
  std::atomic<mlaserve::cluster::ClusterMembership*> joined{nullptr};
  if (!config->etcd_endpoints.empty()) {
    config->server.leave_cluster = [&joined] {
      if (mlaserve::cluster::ClusterMembership* membership = joined.load()) {
        membership->Leave(/*moving_out=*/true);
      }
    };
  }
  config->server.stop_server = [] { kill(getpid(), SIGTERM); };

  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<mlaserve::service::MlaServer>> server =
      mlaserve::service::MlaServer::Start(mlaserve::engine::CreateEngine, config->engine,
                                          config->server);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", std::string(server.status().message()));
    return EXIT_FAILURE;
  }
  // A unix socket has no port (gRPC reports 1 for it): the log names its path instead.
  const bool unix_socket = absl::StartsWith(config->server.listen_address, "unix:");
  spdlog::info("listening: gRPC on {} ({}, {}{}), metrics {}",
               unix_socket ? std::string(config->server.listen_address)
                           : absl::StrCat("port ", (*server)->port()),
               config->server.listen_address, config->server.tls.mode(),
               (*server)->guard() != nullptr  ? ", behind the HTTP/2 guard"
               : config->server.tls.enabled() ? ", no HTTP/2 guard: TLS listeners are gRPC's own"
               : !config->server.http2_guard  ? ", no HTTP/2 guard (--http2_guard=false)"
                                              : ", no HTTP/2 guard on a unix socket",
               (*server)->metrics_port() > 0
                   ? absl::StrCat("on port ", (*server)->metrics_port(), " at /metrics (",
                                  (*server)->metrics_mode(), ")")
                   : std::string("disabled"));

  for (const mlaserve::engine::DeviceInfo& device : (*server)->engine().Info().devices) {
    if (device.kind != "gpu") continue;
    spdlog::info(
        "device: {}; KV cache in its memory, budget {} MiB (matrix {:.0f} TFLOP/s, "
        "memory {:.2f} TB/s: B_theta(1) {:.1f})",
        device.description, (*server)->engine().Info().kv_budget_bytes >> 20, device.matrix_tflops,
        device.hbm_tbps, (*server)->engine().Info().b_theta_by_sq.front());
  }

  const mlaserve::service::Tenancy* tenancy = config->server.tenancy.get();
  switch (tenancy == nullptr ? mlaserve::service::Tenancy::Mode::kSingleTenant : tenancy->mode()) {
    case mlaserve::service::Tenancy::Mode::kSingleTenant:
      spdlog::info(
          "tenants: single-tenant (no --auth_tokens_file, no --tls_client_ca): every client "
          "reaches every prefix and sequence id");
      break;
    case mlaserve::service::Tenancy::Mode::kTokens:
      spdlog::info(
          "tenants: {} from --auth_tokens_file; calls without a known bearer token "
          "get UNAUTHENTICATED",
          tenancy->Known().size());
      break;
    case mlaserve::service::Tenancy::Mode::kCertificates:
      spdlog::info("tenants: one per client certificate common name (mutual TLS)");
      break;
  }

  if (absl::Status warm = (*server)->WarmUp(); !warm.ok()) {
    spdlog::error("warm-up failed: {}", std::string(warm.message()));
    (*server)->Shutdown(absl::ZeroDuration()).IgnoreError();
    return EXIT_FAILURE;
  }
  (*server)->SetServing(true);
  sd_notify(0, "READY=1\nSTATUS=serving");
  spdlog::info("ready: serving after {:.2f} s", absl::ToDoubleSeconds(absl::Now() - start));

  std::unique_ptr<mlaserve::cluster::ClusterMembership> membership;
  if (!config->etcd_endpoints.empty()) {
    absl::StatusOr<std::string> address = mlaserve::cluster::AdvertiseAddress(
        config->advertise_address, config->server.listen_address, (*server)->port());
    absl::StatusOr<std::unique_ptr<mlaserve::cluster::EtcdClient>> etcd =
        address.ok()
            ? mlaserve::cluster::EtcdClient::Connect(config->etcd_endpoints, *etcd_credentials)
            : address.status();
    absl::StatusOr<std::unique_ptr<mlaserve::cluster::ClusterMembership>> started =
        etcd.ok() ? mlaserve::cluster::ClusterMembership::Start(
                        std::move(*etcd), config->membership,
                        mlaserve::cluster::DescribeServer(**server, *address, MLASERVE_VERSION))
                  : etcd.status();
    if (!started.ok()) {
      spdlog::error("cannot join the cluster: {}", std::string(started.status().message()));
      (*server)->Shutdown(absl::ZeroDuration()).IgnoreError();
      return EXIT_FAILURE;
    }
    membership = std::move(*started);
    joined.store(membership.get());
  }

  int signal = 0;
  sigwait(&shutdown_signals, &signal);
  spdlog::info("draining: {} received; in-flight calls have {} s",
               signal == SIGTERM ? "SIGTERM" : "SIGINT",
               absl::ToInt64Seconds(config->drain_timeout));
  sd_notify(0, "STOPPING=1\nSTATUS=draining");
  // Out of the membership first, so that clients place no new sequence here while it drains.
  if (membership != nullptr) membership->Leave();
  const absl::Status drained = (*server)->Shutdown(config->drain_timeout);
  if (drained.ok()) {
    spdlog::info("stopped: drained cleanly");
  } else {
    spdlog::warn("stopped: {}", std::string(drained.message()));
  }
  // A device fault is a failure: the unit's Restart=on-failure takes it.
  if (const absl::Status fault = (*server)->fault(); !fault.ok()) {
    spdlog::error("stopped after a device fault: {}", std::string(fault.message()));
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
