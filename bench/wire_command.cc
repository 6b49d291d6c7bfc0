#include "bench/wire_command.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/host_description.h"
#include "bench/loopback_wire.h"
#include "client/loadgen/grpc_load_target.h"
#include "client/loadgen/load_report.h"
#include "client/transport_hint.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace mlaserve::bench {

absl::Status RunWireCommand(const WireCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(const engine::ModelConfig model,
                   engine::PresetModelConfig(o.model, {.layers = o.layers}));
  WireProbe probe = CallWireBytes(model, o.workload);
  if (!o.listen.empty()) {
    return ServeWireEcho(o.listen, probe.request_bytes, probe.response_bytes);
  }
  if (o.target.empty() || o.echo.empty()) {
    return absl::InvalidArgumentError(
        "--target and --wire_echo: the server and the far end (or --wire_listen to be one)");
  }
  spdlog::set_level(spdlog::level::warn);
  client::ClientOptions options;
  options.timeout = absl::Seconds(120);
  options.data_plane = client::ClientOptions::DataPlane::kUcx;
  auto client = client::MlaServeClient::Connect(o.target, options);
  RETURN_IF_ERROR(client::WaitForServer(*client, absl::Seconds(30), false));
  RETURN_IF_ERROR(client->UcxPlane().status());
  ASSIGN_OR_RETURN(auto target, loadgen::GrpcLoadTarget::Create(std::move(client), true));
  struct Round {
    loadgen::LoadSummary ucx;
    loadgen::Percentiles wire;
  };
  std::vector<Round> rounds;
  for (int round = 0; round < std::max(1, o.rounds); ++round) {
    loadgen::WorkloadOptions w = o.workload;
    w.run_id = absl::StrFormat("wire-%d", round);
    ASSIGN_OR_RETURN(loadgen::LoadResult result, loadgen::RunWorkload(*target, w));
    loadgen::LoadSummary summary = loadgen::Summarize(result);
    if (summary.failed_calls > 0) {
      return absl::InternalError(absl::StrFormat("ucx: %d calls failed", summary.failed_calls));
    }
    // The wire idles between round trips as long as the server works on a call, so both
    // ends are as cold (or warm) as the plane's are.
    probe.idle_between =
        absl::Milliseconds(std::max(0.0, summary.latency_ms.p50 - summary.overhead_us.p50 / 1e3));
    probe.calls = std::clamp(static_cast<int>(absl::ToDoubleSeconds(w.duration) * 1e3 /
                                              std::max(1.0, summary.latency_ms.p50)),
                             20, 400);
    ASSIGN_OR_RETURN(loadgen::Percentiles wire, MeasureRoundTripTo(o.echo, probe));
    rounds.push_back({summary, wire});
  }
  const loadgen::WorkloadOptions& w = o.workload;
  out << absl::StrFormat(
      "UCX data plane against the raw TCP wire: %s (%d layers) at %s, %d workers x %d "
      "sequences, prefix %d + own %d tokens, sq %d, %s space, %.0f s per run; far end %s\n",
      o.model, o.layers, o.target, w.workers, w.sequences, w.prefix_tokens, w.context_tokens, w.sq,
      w.head_space ? "head" : "latent", absl::ToDoubleSeconds(w.duration), o.echo);
  out << HostDescription() << "\n";
  out << absl::StrFormat("%5s %10s %10s %12s %12s %12s %12s %12s %9s\n", "round", "queries/s",
                         "lat_p50_ms", "server_p50_ms", "ucx_p50_us", "ucx_p99_us", "wire_p50_us",
                         "wire_p99_us", "ucx/wire");
  double best = 0;
  for (size_t r = 0; r < rounds.size(); ++r) {
    const loadgen::LoadSummary& s = rounds[r].ucx;
    const double ratio = s.overhead_us.p50 / std::max(1.0, rounds[r].wire.p50);
    best = r == 0 ? ratio : std::min(best, ratio);
    out << absl::StrFormat("%5d %10.1f %10.2f %12.2f %12.1f %12.1f %12.1f %12.1f %9.2f\n",
                           static_cast<int>(r), s.queries_per_s, s.latency_ms.p50,
                           s.latency_ms.p50 - s.overhead_us.p50 / 1e3, s.overhead_us.p50,
                           s.overhead_us.p99, rounds[r].wire.p50, rounds[r].wire.p99, ratio);
  }
  out << absl::StrFormat(
      "ucx_*_us: a call's latency less the server's own time (queue and device host time), "
      "what the plane costs; wire_*_us: a TCP round trip of the call's %.2f MB out and %.2f MB "
      "back between the same two ends; ucx/wire %.2f at best (goal <= 1.5)\n",
      probe.request_bytes / 1e6, probe.response_bytes / 1e6, best);
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
