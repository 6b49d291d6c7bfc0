#include "bench/service_command.h"

#include "bench/host_description.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/engine_load_target.h"
#include "bench/loopback_wire.h"
#include "client/loadgen/grpc_load_target.h"
#include "client/loadgen/load_report.h"
#include "common/status_macros.h"
#include "server/engine/model/model_config.h"
#include "server/service/mla_server.h"
#include "spdlog/spdlog.h"

namespace mlaserve::bench {
namespace {

struct PathResult {
  std::string path;
  int round = 0;
  loadgen::LoadSummary summary;
  double empty_rpc_us = 0;  // gRPC only
};

// Calls a floor probe makes when it idles `idle_ms` before each: about 3 s, 10 to 200 calls.
int ProbeCalls(double idle_ms) {
  return std::clamp(static_cast<int>(3000 / std::max(idle_ms, 1.0)), 10, 200);
}

// gRPC's own floor: an RPC that carries nothing and does nothing (GetServerInfo), sent as the
// workload's callers send, idle between calls as long as a call takes.
absl::StatusOr<double> EmptyRpcP50Us(client::MlaServeClient& client, double idle_ms) {
  std::vector<double> us;
  for (int call = 0; call < ProbeCalls(idle_ms) + 1;
       ++call) {  // the first call warms the channel up
    absl::SleepFor(absl::Milliseconds(idle_ms));
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(client.GetServerInfo().status());
    if (call > 0) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  return loadgen::PercentilesOf(std::move(us)).p50;
}

absl::StatusOr<engine::EngineOptions> EngineOptionsFor(const ServiceCommandOptions& o) {
  engine::EngineOptions e;
  ASSIGN_OR_RETURN(e.model, engine::PresetModelConfig(o.model, {.layers = o.layers}));
  e.weights.seed = 1;
  e.kv.budget_bytes = int64_t{2} << 30;  // the server's default
  e.devices = o.devices;
  if (!o.profile.empty()) e.profile = o.profile;
  if (!o.gpu.empty()) {
    e.gpu = o.gpu;
    e.devices = 1;
    e.kv.budget_bytes = 0;  // what the GPU's memory allows
  }
  return e;
}

absl::StatusOr<loadgen::LoadSummary> RunDirect(const ServiceCommandOptions& o,
                                               const loadgen::WorkloadOptions& w,
                                               bool batch_invariant) {
  ASSIGN_OR_RETURN(engine::EngineOptions options, EngineOptionsFor(o));
  options.batch_invariant = batch_invariant;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                   engine::CreateEngine(std::move(options)));
  EngineLoadTarget target(*engine);
  ASSIGN_OR_RETURN(loadgen::LoadResult result, loadgen::RunWorkload(target, w));
  return loadgen::Summarize(result);
}

// One path through the server: gRPC listening itself ("grpc") or behind the guard, a message
// per query or packed, the same-host data plane ("shm"), or the UCX plane on loopback ("ucx").
absl::StatusOr<loadgen::LoadSummary> RunThroughServer(const ServiceCommandOptions& o,
                                                      const loadgen::WorkloadOptions& w,
                                                      const std::string& path,
                                                      double* empty_rpc_us) {
  ASSIGN_OR_RETURN(engine::EngineOptions options, EngineOptionsFor(o));
  service::ServerOptions server_options;
  server_options.listen_address = "127.0.0.1:0";
  server_options.http2_guard = path != "grpc";
  server_options.metrics_address = "";
  if (path == "shm") {
    server_options.data_plane_socket = absl::StrCat("@mlaserve-bench-", getpid());
    server_options.data_plane_poll = absl::Microseconds(200);  // the server's default
  }
  if (path == "ucx") server_options.data_plane_ucx = "127.0.0.1:0";
  ASSIGN_OR_RETURN(
      std::unique_ptr<service::MlaServer> server,
      service::MlaServer::Start(engine::CreateEngine, std::move(options), server_options));
  RETURN_IF_ERROR(server->WarmUp());
  server->SetServing(true);
  client::ClientOptions client_options;
  client_options.timeout = absl::Seconds(120);
  client_options.data_plane = path == "shm"   ? client::ClientOptions::DataPlane::kShm
                              : path == "ucx" ? client::ClientOptions::DataPlane::kUcx
                                              : client::ClientOptions::DataPlane::kGrpc;
  auto client =
      client::MlaServeClient::Connect(absl::StrCat("127.0.0.1:", server->port()), client_options);
  const bool packed = path == "packed" || path == "shm" || path == "ucx";
  ASSIGN_OR_RETURN(auto target, loadgen::GrpcLoadTarget::Create(std::move(client), packed));
  ASSIGN_OR_RETURN(loadgen::LoadResult result, loadgen::RunWorkload(*target, w));
  loadgen::LoadSummary summary = loadgen::Summarize(result);
  auto probe_client =
      client::MlaServeClient::Connect(absl::StrCat("127.0.0.1:", server->port()), client_options);
  ASSIGN_OR_RETURN(*empty_rpc_us, EmptyRpcP50Us(*probe_client, summary.latency_ms.p50));
  server->Shutdown(absl::Seconds(10)).IgnoreError();
  return summary;
}

}  // namespace

absl::Status RunServiceCommand(const ServiceCommandOptions& o, std::ostream& out) {
  spdlog::set_level(spdlog::level::warn);  // the in-process server's lifecycle lines
  std::vector<PathResult> results;
  for (int round = 0; round < std::max(1, o.rounds); ++round) {
    for (const std::string& path : o.paths) {
      loadgen::WorkloadOptions w = o.workload;
      w.run_id = absl::StrCat("bench-", path, "-", round);
      double empty_rpc_us = 0;
      absl::StatusOr<loadgen::LoadSummary> s =
          path == "direct" || path == "invariant"
              ? RunDirect(o, w, /*batch_invariant=*/path == "invariant")
              : RunThroughServer(o, w, path, &empty_rpc_us);
      if (!s.ok()) return s.status();
      if (s->failed_calls > 0) {
        return absl::InternalError(absl::StrCat(path, ": ", s->failed_calls, " calls failed"));
      }
      results.push_back({path, round, *s, empty_rpc_us});
    }
  }
  std::map<std::string, double> best;  // each path's best throughput over the rounds
  for (const PathResult& r : results) {
    best[r.path] = std::max(best[r.path], r.summary.queries_per_s);
  }
  // Throughput ratios of neighbouring paths (where both ran).
  const std::pair<const char*, const char*> kRatios[] = {
      {"grpc", "direct"}, {"guarded", "grpc"}, {"packed", "guarded"},  {"shm", "packed"},
      {"ucx", "packed"},  {"shm", "direct"},   {"invariant", "direct"}};
  std::vector<std::tuple<std::string, std::string, double>> ratios;
  for (const auto& [over, under] : kRatios) {
    if (best.count(over) > 0 && best.count(under) > 0 && best[under] > 0) {
      ratios.emplace_back(over, under, best[over] / best[under]);
    }
  }
  const loadgen::WorkloadOptions& w = o.workload;
  // The wire's own round trip for the same bytes, idle between calls as long as a direct call
  // takes: what no RPC stack on this machine can undercut.
  ASSIGN_OR_RETURN(const engine::ModelConfig model,
                   engine::PresetModelConfig(o.model, {.layers = o.layers}));
  WireProbe probe = CallWireBytes(model, w);
  double direct_latency_ms = 0;
  for (const PathResult& r : results) {
    if (r.path == "direct")
      direct_latency_ms = std::max(direct_latency_ms, r.summary.latency_ms.p50);
  }
  probe.idle_between = absl::Milliseconds(direct_latency_ms);
  probe.calls = ProbeCalls(direct_latency_ms);
  ASSIGN_OR_RETURN(const loadgen::Percentiles wire, MeasureLoopbackRoundTrip(probe));
  if (o.json) {
    for (const PathResult& r : results) {
      const loadgen::LoadSummary& s = r.summary;
      nlohmann::json row = {
          {"path", r.path},
          {"round", r.round},
          {"workers", w.workers},
          {"sequences", w.sequences},
          {"queries_per_s", s.queries_per_s},
          {"latency_ms", {{"p50", s.latency_ms.p50}, {"p99", s.latency_ms.p99}}},
          {"overhead_us", {{"p50", s.overhead_us.p50}, {"p99", s.overhead_us.p99}}},
          {"queue_us", {{"p50", s.queue_us.p50}, {"p99", s.queue_us.p99}}},
          {"mean_batch_size", s.mean_batch_size}};
      if (r.path != "direct") row["empty_rpc_us"] = r.empty_rpc_us;
      out << row.dump() << "\n";
    }
    nlohmann::json summary;
    for (const auto& [over, under, ratio] : ratios) summary[over + "_over_" + under] = ratio;
    summary["wire"] = nlohmann::json{{"request_bytes", probe.request_bytes},
                                     {"response_bytes", probe.response_bytes},
                                     {"round_trip_us", {{"p50", wire.p50}, {"p99", wire.p99}}}};
    out << summary.dump() << "\n";
    return absl::OkStatus();
  }
  out << absl::StrFormat(
      "service overhead: %s (%d layers) on %s, %d workers x %d sequences, prefix %d + own %d "
      "tokens, "
      "sq %d, %.0f s per run\n",
      o.model, o.layers,
      !o.gpu.empty() ? o.gpu
                     : absl::StrCat(o.devices, " x ", o.profile.empty() ? "default" : o.profile),
      w.workers, w.sequences, w.prefix_tokens, w.context_tokens, w.sq,
      absl::ToDoubleSeconds(w.duration));
  out << HostDescription() << "\n";
  out << absl::StrFormat("%-7s %5s %10s %10s %10s %12s %10s %10s %12s %12s %8s %12s\n", "path",
                         "round", "queries/s", "lat_p50_ms", "lat_p99_ms", "queue_p50_us",
                         "dev_p50_ms", "dev_us", "ovhd_p50_us", "ovhd_p99_us", "batch",
                         "empty_rpc_us");
  for (const PathResult& r : results) {
    const loadgen::LoadSummary& s = r.summary;
    out << absl::StrFormat(
        "%-7s %5d %10.1f %10.2f %10.2f %12.1f %10.3f %10.1f %12.1f %12.1f %8.1f %12s\n", r.path,
        r.round, s.queries_per_s, s.latency_ms.p50, s.latency_ms.p99, s.queue_us.p50,
        s.device_host_ms.p50, s.mean_device_modeled_us, s.overhead_us.p50, s.overhead_us.p99,
        s.mean_batch_size, r.path != "direct" ? absl::StrFormat("%.1f", r.empty_rpc_us) : "-");
  }
  out << absl::StrFormat("%-7s %5s %10s %10s %10s %12s %10s %10s %12.1f %12.1f %8s %12s\n", "wire",
                         "-", "-", "-", "-", "-", "-", "-", wire.p50, wire.p99, "-", "-");
  out << absl::StrFormat("throughput ratios (best of %d each):", std::max(1, o.rounds));
  for (const auto& [over, under, ratio] : ratios) {
    out << absl::StrFormat(" %s/%s %.3f", over, under, ratio);
  }
  out << "\n";
  out << absl::StrFormat(
      "wire: TCP round trip on loopback of the call's %.2f MB out and %.2f MB back, idle %.1f ms "
      "between calls as the callers are; the floor under the gRPC edge (ovhd grpc - direct).\n"
      "dev_p50_ms: the device's host time for a batch (queries in, answers out); dev_us: an "
      "emulated device's modelled time per batch (0 on a GPU: its kernels' time is "
      "mlaserve_device_kernel_seconds in /metrics)\n"
      "empty_rpc_us: GetServerInfo with the same idle gaps, gRPC's own cost for a call\n"
      "grpc: a message per query, gRPC listening itself (--http2_guard=false); guarded: the "
      "same behind the HTTP/2 guard's relay, the server's default; packed: one packed message "
      "a call behind the guard; shm: the same-host data plane; ucx: the UCX data plane on "
      "loopback (mlaserve-bench wire measures it between two hosts); invariant: direct with "
      "every call batch-invariant\n",
      probe.request_bytes / 1e6, probe.response_bytes / 1e6, direct_latency_ms);
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
