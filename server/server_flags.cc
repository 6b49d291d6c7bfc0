#include "server/server_flags.h"

#include "kernels/gpu/open_gpu.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/command_line.h"
#include "common/status_macros.h"
#include "kernels/core/matmul.h"
#include "server/data_plane_flags.h"
#include "server/engine/devices/pool_sizing.h"
#include "server/engine/model/model_config.h"

// The defaults serve a small demo model on loopback: `mlaserve-server` alone starts in
// seconds. Production sets --layers 0 (the whole model), --weights, --kv_budget.
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address, host:port (port 0: any free)");
ABSL_FLAG(std::string, model, "deepseek-v3", "Model preset: deepseek-v3 or kimi-k2");
ABSL_FLAG(int, layers, 4, "Layers to serve (0: all of the preset's); a demo serves a few");
ABSL_FLAG(std::string, weights, "",
          "safetensors file with the layers' kv_b_proj (BF16/F32); empty: seeded weights");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the generated weights when --weights is empty");
ABSL_FLAG(std::string, devices, "auto",
          "The device pool: auto (emulated NPUs of --profile, as many as the host's usable CPUs "
          "serve best), N emulated NPUs, host (the CPU directly), or cuda:N (NVIDIA GPU N; the "
          "KV cache then lives in its memory; a GPU is used only when named)");
ABSL_FLAG(std::string, profile, mlaserve::engine::EngineOptions().profile,
          "Device profile name, or \"host\" for the CPU-direct device");
ABSL_FLAG(bool, share_cpus, true,
          "A pool of emulated devices sized from the host shares its CPUs: a lone busy device "
          "runs on the idle ones' CPUs too (never more threads at once than usable CPUs)");
ABSL_FLAG(std::string, host_threads, "auto",
          "Host threads per device: N, or auto (the usable CPUs shared out over the devices; "
          "1 each when --devices is auto too)");
ABSL_FLAG(int, preload, 2, "Preload count of the emulated devices' AMLA pipeline: 0, 1 or 2");
ABSL_FLAG(double, matrix_tflops, 0,
          "Override of the device matrix rate the TyphoonMLA threshold uses (0: profile)");
ABSL_FLAG(double, hbm_tbps, 0,
          "Override of the device memory bandwidth the threshold uses (0: profile)");
ABSL_FLAG(std::string, kv_budget, "auto",
          "KV cache memory budget, e.g. 512MiB, 2GiB; auto: 2GiB on the CPU devices, on a GPU "
          "3/4 of its free memory after the weights and a 2 GiB reserve");
ABSL_FLAG(int, page_size, 128,
          "Tokens per bf16 KV page (an FP8 page holds more in the same bytes)");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "KV format of a prefix or sequence created without one: bf16, or fp8 (SnapMLA's "
          "RoPE-aware per-token FP8, 644 instead of 1152 bytes a token and layer)");
ABSL_FLAG(int, max_batch, 256, "Queries per device batch (and per Decode call)");
ABSL_FLAG(int, max_sq, 4, "Query tokens per decode query (MTP)");
ABSL_FLAG(int64_t, max_wait_us, 500, "How long a device batch waits to fill, microseconds");
ABSL_FLAG(int, max_queue, 4096, "Decode queries that may wait; beyond it UNAVAILABLE");
ABSL_FLAG(bool, batch_invariant, false,
          "Batch-invariant answers for calls that do not choose (DecodeCallOptions."
          "batch_invariant): each query's answer bit for bit what it gets alone, absorb-only, "
          "split-KV parts of a fixed length");
ABSL_FLAG(bool, typhoon, true,
          "TyphoonMLA: head-space groups on a shared prefix run its naive pass once they reach "
          "B_theta queries; false: absorb-only for every group, no prefix expanded");
ABSL_FLAG(int, max_message_mb, 64, "Largest request message, MiB");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address, host:port; empty disables it");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain for TLS on the gRPC port (with --tls_key); empty: plaintext");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: with it, every client must present a certificate it signed (mTLS)");
ABSL_FLAG(int, tls_reload_s, 10,
          "How often the TLS files are re-read (renewed certificates apply without a restart)");
ABSL_FLAG(std::string, grpc_memory, "1GiB",
          "Memory gRPC may hold for messages in transit, all connections together; past it "
          "the connection holding most is closed");
ABSL_FLAG(int, max_streams_per_connection, 256, "Concurrent streams (calls) per connection");
ABSL_FLAG(int, max_streams_per_client, 1024,
          "Open DecodeStream and AppendKv streams one client (a tenant, or a peer address "
          "without tenants) may hold over all its connections; 0: no limit");
ABSL_FLAG(bool, http2_guard, true,
          "Relay plaintext connections to gRPC through mlaserve's HTTP/2 guard: rapid-reset "
          "floods end with GOAWAY, messages are refused by their declared length "
          "(docs/deploy.md, \"HTTP/2 guard\")");
ABSL_FLAG(int, http2_reset_burst, 1000,
          "RST_STREAM frames a connection may send at once before the guard ends it "
          "(a client's connections together: 4x)");
ABSL_FLAG(int, http2_resets_per_s, 200, "RST_STREAM frames per second a connection may sustain");
ABSL_FLAG(int, http2_stream_burst, 20000, "Streams a connection may open at once");
ABSL_FLAG(int, http2_streams_per_s, 20000, "Streams per second a connection may sustain");
ABSL_FLAG(int, http2_guard_threads, 1, "Threads relaying the guard's connections");
ABSL_FLAG(int, keepalive_s, 60,
          "Ping a connection idle this long; close it if no answer in --keepalive_timeout_s");
ABSL_FLAG(int, keepalive_timeout_s, 20, "How long a keepalive ping may go unanswered");
ABSL_FLAG(int, max_connection_idle_s, 1800,
          "Close a connection without calls for this long (0: never)");
ABSL_FLAG(int, max_connection_age_s, 0, "Ask connections older than this to reconnect (0: never)");
ABSL_FLAG(int, max_connection_age_grace_s, 30,
          "How long an aged connection's calls may still run before it is closed");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "Comma-separated host:port of etcd members: the server registers in the cluster "
          "under a lease and keeps its load fresh there (docs/cluster.md); empty: standalone");
ABSL_FLAG(std::string, cluster, "default",
          "Name of the cluster in etcd (the key prefix /mlaserve/NAME/servers/)");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port clients dial, as written in etcd; empty: --listen's, with the host name "
          "for a wildcard address");
ABSL_FLAG(std::string, etcd_ca, "",
          "PEM CA of etcd's client certificate: TLS towards etcd (plaintext without it)");
ABSL_FLAG(std::string, etcd_cert, "",
          "PEM client certificate for an etcd that requires one (with --etcd_key)");
ABSL_FLAG(std::string, etcd_key, "", "PEM key of --etcd_cert");
ABSL_FLAG(int, etcd_lease_ttl_s, 10,
          "Lease of the server's etcd record: a server that dies leaves the membership this "
          "long after its last renewal (renewed every ttl/3 or 2 s)");
ABSL_FLAG(int, drain_timeout_s, 30,
          "On SIGTERM/SIGINT, how long in-flight calls may take before they are cancelled");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "JSON file of tenants: each a name, the SHA-256 of its bearer token (or, under mutual "
          "TLS, its certificate's common name), a KV quota, a queue share and rights "
          "(docs/deploy.md, Tenants). Empty: one tenant, or under --tls_client_ca each client "
          "certificate's common name");
ABSL_FLAG(double, tenant_queue_share, 0.5,
          "Share of --max_queue one tenant may fill, for tenants that name none (0 < x <= 1)");
ABSL_FLAG(std::string, state_dir, "",
          "Directory the KV store is saved to after a drain and loaded from at start, so a "
          "restart keeps every sequence (the unit's StateDirectory=); empty: keep no state");
ABSL_FLAG(double, snapshot_interval_s, 0,
          "Also save the KV state this often while serving (0: only on a drain); a kill -9 "
          "loses at most this much. Needs --state_dir");
ABSL_FLAG(double, heap_release_interval_s, 60,
          "Hand freed memory back to the kernel this often (malloc_trim), so RSS follows the "
          "memory in use; 0: never");

namespace mlaserve {
namespace {

absl::Status BadFlag(absl::string_view flag, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

absl::Status RequirePositive(absl::string_view flag, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return BadFlag(flag, absl::StrCat(value, " must be positive"));
}

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& text) {
  // spdlog maps unknown names to `off`, which would silence a typo.
  const spdlog::level::level_enum level = spdlog::level::from_str(text);
  if (level == spdlog::level::off && text != "off") {
    return BadFlag("log_level", absl::StrCat("unknown level \"", text, "\""));
  }
  return level;
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (
      split < trimmed.size() &&
      (absl::ascii_isdigit(static_cast<unsigned char>(trimmed[split])) || trimmed[split] == '.')) {
    ++split;
  }
  double number = 0;
  if (split == 0 || !absl::SimpleAtod(trimmed.substr(0, split), &number)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not a byte size"));
  }
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(trimmed.substr(split)));
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"", 1},         {"b", 1},    {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30},
      {"tib", 0x1p40}, {"kb", 1e3}, {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12}};
  for (const auto& [name, multiplier] : kUnits) {
    if (unit != name) continue;
    const double bytes = std::floor(number * multiplier);
    if (bytes >= 0x1p63) {
      return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is too large"));
    }
    return static_cast<int64_t>(bytes);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", text, "\" has an unknown unit; use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB"));
}

namespace {

// A --devices or --host_threads count: a positive number, or nullopt for auto.
absl::StatusOr<std::optional<int>> PoolCount(absl::string_view flag, const std::string& text,
                                             absl::string_view other_values) {
  if (text == "auto") return std::nullopt;
  int count = 0;
  if (!absl::SimpleAtoi(text, &count)) {
    return BadFlag(flag, absl::StrCat("'", text, "' is not ", other_values));
  }
  RETURN_IF_ERROR(RequirePositive(flag, count));
  return count;
}

// --devices and --host_threads: a GPU as named, or a CPU pool sized from `host` where a flag
// says auto (devices/pool_sizing.h).
absl::Status ParsePool(const HostResources& host, engine::EngineOptions& engine) {
  const std::string devices = absl::GetFlag(FLAGS_devices);
  engine::PoolRequest request;
  ASSIGN_OR_RETURN(
      request.host_threads,
      PoolCount("host_threads", absl::GetFlag(FLAGS_host_threads), "a number or auto"));
  if (gpu::IsGpuName(devices)) {
    engine.gpu = devices;
    engine.devices = 1;
    engine.host_threads_per_device = request.host_threads.value_or(1);
    return absl::OkStatus();
  }
  if (devices == "host") {
    engine.profile = "host";
    request.host_device = true;
  } else {
    ASSIGN_OR_RETURN(
        request.devices,
        PoolCount("devices", devices, "auto, a number of emulated devices, host, or cuda:N"));
  }
  // Host devices compute on every usable CPU already (--profile=host): nothing to lend.
  request.share_cpus = absl::GetFlag(FLAGS_share_cpus) && engine.profile != "host";
  const engine::PoolSizing sizing = engine::SizePool(request, host);
  engine.devices = sizing.devices;
  engine.host_threads_per_device = sizing.host_threads;
  engine.shared_cpus = sizing.shared_cpus;
  engine.sizing = {.usable_cpus = sizing.usable_cpus,
                   .cpu_quota = host.cpu_quota,
                   .numa_nodes = static_cast<int>(host.numa_nodes.size()),
                   .rule = sizing.rule,
                   .oversubscribed = sizing.oversubscribed};
  return absl::OkStatus();
}

// Seconds flags of the connection limits: `value` seconds in [minimum, one day].
absl::StatusOr<absl::Duration> SecondsFlag(absl::string_view flag, int value, int minimum) {
  constexpr int kDay = 86400;
  if (value < minimum || value > kDay) {
    return BadFlag(flag, absl::StrCat(value, " is outside [", minimum, ", ", kDay, "]"));
  }
  return absl::Seconds(value);
}

absl::Status ParseConnectionFlags(service::ServerOptions& server) {
  absl::StatusOr<int64_t> memory = ParseByteSize(absl::GetFlag(FLAGS_grpc_memory));
  if (!memory.ok()) return BadFlag("grpc_memory", memory.status().message());
  // Below two messages' worth, a single large request could never be received.
  if (*memory < 2 * server.max_message_bytes) {
    return BadFlag("grpc_memory",
                   absl::StrCat(*memory, " bytes is less than twice ", "--max_message_mb (",
                                server.max_message_bytes, " bytes)"));
  }
  server.grpc_memory_bytes = *memory;
  server.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  server.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  server.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  ASSIGN_OR_RETURN(server.tls.reload_interval,
                   SecondsFlag("tls_reload_s", absl::GetFlag(FLAGS_tls_reload_s), 1));
  const int streams = absl::GetFlag(FLAGS_max_streams_per_connection);
  if (streams < 1 || streams > 65536) {
    return BadFlag("max_streams_per_connection", absl::StrCat(streams, " is outside [1, 65536]"));
  }
  server.max_streams_per_connection = streams;
  const int client_streams = absl::GetFlag(FLAGS_max_streams_per_client);
  if (client_streams < 0 || client_streams > 1 << 20) {
    return BadFlag("max_streams_per_client",
                   absl::StrCat(client_streams, " is outside [0, 1048576]"));
  }
  server.max_streams_per_client = client_streams;
  server.http2_guard = absl::GetFlag(FLAGS_http2_guard);
  const auto positive = [](const char* name, int value, int most) -> absl::StatusOr<int> {
    if (value < 1 || value > most) {
      return BadFlag(name, absl::StrCat(value, " is outside [1, ", most, "]"));
    }
    return value;
  };
  ASSIGN_OR_RETURN(const int reset_burst,
                   positive("http2_reset_burst", absl::GetFlag(FLAGS_http2_reset_burst), 1 << 24));
  ASSIGN_OR_RETURN(
      const int resets_per_s,
      positive("http2_resets_per_s", absl::GetFlag(FLAGS_http2_resets_per_s), 1 << 24));
  ASSIGN_OR_RETURN(
      const int stream_burst,
      positive("http2_stream_burst", absl::GetFlag(FLAGS_http2_stream_burst), 1 << 24));
  ASSIGN_OR_RETURN(
      const int streams_per_s,
      positive("http2_streams_per_s", absl::GetFlag(FLAGS_http2_streams_per_s), 1 << 24));
  ASSIGN_OR_RETURN(server.guard_threads,
                   positive("http2_guard_threads", absl::GetFlag(FLAGS_http2_guard_threads), 64));
  server.guard_limits.reset_burst = reset_burst;
  server.guard_limits.resets_per_second = resets_per_s;
  server.guard_limits.stream_burst = stream_burst;
  server.guard_limits.streams_per_second = streams_per_s;
  ASSIGN_OR_RETURN(server.keepalive_time,
                   SecondsFlag("keepalive_s", absl::GetFlag(FLAGS_keepalive_s), 1));
  ASSIGN_OR_RETURN(server.keepalive_timeout,
                   SecondsFlag("keepalive_timeout_s", absl::GetFlag(FLAGS_keepalive_timeout_s), 1));
  ASSIGN_OR_RETURN(
      server.max_connection_idle,
      SecondsFlag("max_connection_idle_s", absl::GetFlag(FLAGS_max_connection_idle_s), 0));
  if (server.max_connection_idle == absl::ZeroDuration()) {
    server.max_connection_idle = absl::InfiniteDuration();
  }
  ASSIGN_OR_RETURN(
      server.max_connection_age,
      SecondsFlag("max_connection_age_s", absl::GetFlag(FLAGS_max_connection_age_s), 0));
  ASSIGN_OR_RETURN(server.max_connection_age_grace,
                   SecondsFlag("max_connection_age_grace_s",
                               absl::GetFlag(FLAGS_max_connection_age_grace_s), 0));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerConfig> ParseServerCommandLine(int argc, char** argv) {
  absl::StatusOr<HostResources> host = ReadHostResources();
  if (!host.ok()) {
    // A host whose files cannot be read still serves, on what the C++ runtime sees.
    HostResources seen;
    seen.online_cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int cpu = 0; cpu < seen.online_cpus; ++cpu) seen.allowed_cpus.push_back(cpu);
    seen.numa_nodes = {seen.allowed_cpus};
    host = seen;
  }
  return ParseServerCommandLine(argc, argv, *host);
}

absl::StatusOr<ServerConfig> ParseServerCommandLine(int argc, char** argv,
                                                    const HostResources& host) {
  ASSIGN_OR_RETURN(const std::vector<std::string> positional,
                   ParseFlags(argc, argv, MatrixPathDescription));
  if (!positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument \"", positional[0], "\"; every option is a flag"));
  }

  ServerConfig config;
  engine::ModelConfigOverrides overrides;
  const int layers = absl::GetFlag(FLAGS_layers);
  if (layers < 0) return BadFlag("layers", absl::StrCat(layers, " is negative"));
  if (layers > 0) overrides.layers = layers;
  const std::string preset = absl::GetFlag(FLAGS_model);
  absl::StatusOr<engine::ModelConfig> full_model = engine::PresetModelConfig(preset);
  if (!full_model.ok()) return BadFlag("model", full_model.status().message());
  if (layers > full_model->layers) {
    return BadFlag("layers",
                   absl::StrCat(layers, " exceeds ", preset, "'s ", full_model->layers, " layers"));
  }
  absl::StatusOr<engine::ModelConfig> model = engine::PresetModelConfig(preset, overrides);
  if (!model.ok()) return BadFlag("layers", model.status().message());
  engine::EngineOptions& engine = config.engine;
  engine.model = *std::move(model);
  engine.weights.safetensors_path = absl::GetFlag(FLAGS_weights);
  engine.weights.seed = absl::GetFlag(FLAGS_seed);
  if (absl::GetFlag(FLAGS_kv_budget) == "auto") {
    engine.kv.budget_bytes = 0;  // the engine's: the device's default
  } else {
    absl::StatusOr<int64_t> budget = ParseByteSize(absl::GetFlag(FLAGS_kv_budget));
    if (!budget.ok()) return BadFlag("kv_budget", budget.status().message());
    engine.kv.budget_bytes = *budget;
    RETURN_IF_ERROR(RequirePositive("kv_budget", engine.kv.budget_bytes));
  }
  engine.kv.page_size = absl::GetFlag(FLAGS_page_size);
  const std::string kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  if (kv_dtype != "bf16" && kv_dtype != "fp8") {
    return BadFlag("kv_dtype", absl::StrCat("'", kv_dtype, "' is not bf16 or fp8"));
  }
  engine.kv.default_kv_dtype = kv_dtype == "fp8" ? KvDtype::kFp8 : KvDtype::kBf16;
  engine.profile = absl::GetFlag(FLAGS_profile);
  RETURN_IF_ERROR(ParsePool(host, engine));
  engine.preload = absl::GetFlag(FLAGS_preload);
  if (engine.preload < 0 || engine.preload > 2) {
    return BadFlag("preload", absl::StrCat(engine.preload, " is not 0, 1 or 2"));
  }
  engine.max_batch = absl::GetFlag(FLAGS_max_batch);
  engine.max_sq = absl::GetFlag(FLAGS_max_sq);
  engine.max_wait = absl::Microseconds(absl::GetFlag(FLAGS_max_wait_us));
  engine.max_queue = absl::GetFlag(FLAGS_max_queue);
  engine.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  engine.typhoon = absl::GetFlag(FLAGS_typhoon);
  engine.matrix_tflops = absl::GetFlag(FLAGS_matrix_tflops);
  engine.hbm_tbps = absl::GetFlag(FLAGS_hbm_tbps);
  RETURN_IF_ERROR(RequirePositive("page_size", engine.kv.page_size));
  RETURN_IF_ERROR(RequirePositive("max_batch", engine.max_batch));
  RETURN_IF_ERROR(RequirePositive("max_sq", engine.max_sq));
  RETURN_IF_ERROR(RequirePositive("max_queue", engine.max_queue));
  if (absl::GetFlag(FLAGS_max_wait_us) < 0) {
    return BadFlag("max_wait_us", absl::StrCat(absl::GetFlag(FLAGS_max_wait_us), " is negative"));
  }
  if (engine.matrix_tflops < 0 || engine.hbm_tbps < 0) {
    return BadFlag(engine.matrix_tflops < 0 ? "matrix_tflops" : "hbm_tbps",
                   "must be positive, or 0 for the profile's");
  }

  service::ServerOptions& server = config.server;
  server.listen_address = absl::GetFlag(FLAGS_listen);
  if (server.listen_address.empty()) return BadFlag("listen", "empty");
  server.metrics_address = absl::GetFlag(FLAGS_metrics_listen);
  const int max_message_mb = absl::GetFlag(FLAGS_max_message_mb);
  // gRPC takes the limit as an int.
  if (max_message_mb < 1 || max_message_mb > 2047) {
    return BadFlag("max_message_mb", absl::StrCat(max_message_mb, " is outside [1, 2047]"));
  }
  server.max_message_bytes = int64_t{max_message_mb} << 20;
  RETURN_IF_ERROR(ParseConnectionFlags(server));
  RETURN_IF_ERROR(ParseDataPlaneFlags(server));

  ASSIGN_OR_RETURN(config.log_level, ParseLogLevel(absl::GetFlag(FLAGS_log_level)));
  const int drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  if (drain_timeout_s < 0) {
    return BadFlag("drain_timeout_s", absl::StrCat(drain_timeout_s, " is negative"));
  }
  config.drain_timeout = absl::Seconds(drain_timeout_s);

  for (absl::string_view endpoint :
       absl::StrSplit(absl::GetFlag(FLAGS_etcd_endpoints), ',', absl::SkipWhitespace())) {
    endpoint = absl::StripAsciiWhitespace(endpoint);
    if (endpoint.find(':') == absl::string_view::npos) {
      return BadFlag("etcd_endpoints", absl::StrCat("'", endpoint, "' is not host:port"));
    }
    config.etcd_endpoints.emplace_back(endpoint);
  }
  config.membership.cluster = absl::GetFlag(FLAGS_cluster);
  if (config.membership.cluster.empty() ||
      config.membership.cluster.find('/') != std::string::npos) {
    return BadFlag("cluster", "must be a non-empty name without '/'");
  }
  config.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  if (!config.advertise_address.empty() &&
      config.advertise_address.find(':') == std::string::npos) {
    return BadFlag("advertise_address",
                   absl::StrCat("'", config.advertise_address, "' is not host:port"));
  }
  config.etcd_ca_file = absl::GetFlag(FLAGS_etcd_ca);
  config.etcd_cert_file = absl::GetFlag(FLAGS_etcd_cert);
  config.etcd_key_file = absl::GetFlag(FLAGS_etcd_key);
  ASSIGN_OR_RETURN(config.membership.lease_ttl,
                   SecondsFlag("etcd_lease_ttl_s", absl::GetFlag(FLAGS_etcd_lease_ttl_s), 2));

  server.state_dir = absl::GetFlag(FLAGS_state_dir);
  if (!server.state_dir.empty()) {
    std::error_code error;
    if (!std::filesystem::is_directory(server.state_dir, error)) {
      return BadFlag("state_dir", absl::StrCat("'", server.state_dir, "' is not a directory"));
    }
    if (::access(server.state_dir.c_str(), W_OK | X_OK) != 0) {
      return BadFlag("state_dir", absl::StrCat("'", server.state_dir, "' is not writable"));
    }
  }
  const double snapshot_interval_s = absl::GetFlag(FLAGS_snapshot_interval_s);
  if (!(snapshot_interval_s >= 0) || snapshot_interval_s > 86400 * 365) {
    return BadFlag("snapshot_interval_s",
                   absl::StrCat(snapshot_interval_s, " is outside [0, a year]"));
  }
  if (snapshot_interval_s > 0 && server.state_dir.empty()) {
    return BadFlag("snapshot_interval_s", "needs --state_dir");
  }
  server.snapshot_interval = absl::Seconds(snapshot_interval_s);
  const double heap_release_interval_s = absl::GetFlag(FLAGS_heap_release_interval_s);
  if (!(heap_release_interval_s >= 0) || heap_release_interval_s > 86400) {
    return BadFlag("heap_release_interval_s",
                   absl::StrCat(heap_release_interval_s, " is outside [0, a day]"));
  }
  server.heap_release_interval = absl::Seconds(heap_release_interval_s);

  const double share = absl::GetFlag(FLAGS_tenant_queue_share);
  if (!(share > 0 && share <= 1)) {
    return BadFlag("tenant_queue_share", absl::StrCat(share, " is outside (0, 1]"));
  }
  const service::Tenancy::Defaults defaults{
      std::max<int64_t>(1, static_cast<int64_t>(share * config.engine.max_queue))};
  if (const std::string path = absl::GetFlag(FLAGS_auth_tokens_file); !path.empty()) {
    std::ifstream in(path);
    if (!in) return BadFlag("auth_tokens_file", absl::StrCat("cannot read '", path, "'"));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSIGN_OR_RETURN(std::unique_ptr<service::Tenancy> tenancy,
                     service::Tenancy::FromTokensFile(text, path, defaults));
    server.tenancy = std::move(tenancy);
  } else if (!server.tls.client_ca_file.empty()) {
    server.tenancy = service::Tenancy::ByCertificate(defaults);
  } else {
    server.tenancy = service::Tenancy::SingleTenant();
  }
  config.engine.kv.namespace_budget_bytes = server.tenancy->KvQuotas();
  return config;
}

}  // namespace mlaserve
