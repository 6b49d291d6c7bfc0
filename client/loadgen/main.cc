// mlaserve-loadgen: drives a running mlaserve-server the way serving frameworks do and
// prints what a serving engineer asks about (throughput, latency percentiles, where the time
// went, how batches were planned). See docs/loadgen.md.
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "client/loadgen/grpc_load_target.h"
#include "client/loadgen/load_report.h"
#include "client/loadgen/workload.h"
#include "client/mlaserve_client.h"
#include "common/command_line.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address, host:port");
ABSL_FLAG(int, workers, 2, "concurrent callers (serving-framework ranks), one call in flight each");
ABSL_FLAG(int, sequences, 72, "sequences per worker, all decoded in every call");
ABSL_FLAG(int, prefix_tokens, 1024,
          "tokens of the system prompt every sequence starts on (0: none)");
ABSL_FLAG(int, context_tokens, 128, "tokens of each sequence's own prompt");
ABSL_FLAG(int, sq, 1, "query tokens per query (MTP)");
ABSL_FLAG(std::string, space, "head", "query space: head (q_nope, q_pe) or latent (FlashMLA's q)");
ABSL_FLAG(int, layers, 0, "layers each step visits (0: every layer the server serves)");
ABSL_FLAG(std::string, kv_dtype, "",
          "KV format of the run's prefix and sequences: bf16 or fp8 (empty: the server's default)");
ABSL_FLAG(double, duration_s, 10, "how long to run");
ABSL_FLAG(double, connect_timeout_s, 30, "how long to wait for the server");
ABSL_FLAG(uint64_t, seed, 1, "seed of the generated queries and KV rows");
ABSL_FLAG(std::string, run_id, "loadgen", "prefix of every id the run creates");
ABSL_FLAG(bool, json, false, "print the summary as one JSON object");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the server's certificate: TLS (else plaintext)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate, for servers that require one (mTLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the server's certificate carries, when it is not the target's host");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "mlaserve-loadgen [--target host:port] [flags]: closed-loop decode load");
  // Flag names take dashes or underscores (--duration-s = --duration_s), and --flagfile.
  absl::StatusOr<std::vector<std::string>> positional = mlaserve::ParseFlags(argc, argv);
  if (!positional.ok() || !positional->empty()) {
    std::cerr << "mlaserve-loadgen: "
              << (positional.ok() ? "unexpected argument " + positional->front()
                                  : positional.status().ToString())
              << "\n";
    return 2;
  }
  using mlaserve::loadgen::WorkloadOptions;
  WorkloadOptions o;
  o.workers = absl::GetFlag(FLAGS_workers);
  o.sequences = absl::GetFlag(FLAGS_sequences);
  o.prefix_tokens = absl::GetFlag(FLAGS_prefix_tokens);
  o.context_tokens = absl::GetFlag(FLAGS_context_tokens);
  o.sq = absl::GetFlag(FLAGS_sq);
  const std::string space = absl::GetFlag(FLAGS_space);
  if (space != "head" && space != "latent") {
    std::cerr << "--space: '" << space << "' is neither head nor latent\n";
    return 2;
  }
  o.head_space = space == "head";
  o.layers = absl::GetFlag(FLAGS_layers);
  const std::string kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  if (kv_dtype == "bf16" || kv_dtype == "fp8") {
    o.kv_dtype = kv_dtype == "fp8" ? mlaserve::KvDtype::kFp8 : mlaserve::KvDtype::kBf16;
  } else if (!kv_dtype.empty()) {
    std::cerr << "--kv_dtype: '" << kv_dtype << "' is neither bf16 nor fp8\n";
    return 2;
  }
  o.duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
  o.seed = absl::GetFlag(FLAGS_seed);
  o.run_id = absl::GetFlag(FLAGS_run_id);

  const std::string target = absl::GetFlag(FLAGS_target);
  mlaserve::client::ClientOptions client_options;
  client_options.timeout = absl::Seconds(120);
  if (const std::string ca = absl::GetFlag(FLAGS_tls_ca); !ca.empty()) {
    absl::StatusOr<mlaserve::client::ClientTls> tls = mlaserve::client::LoadClientTls(
        ca, absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key));
    if (!tls.ok()) {
      std::cerr << "--tls_ca/--tls_cert/--tls_key: " << tls.status().message() << "\n";
      return 2;
    }
    client_options.tls = *std::move(tls);
    client_options.tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  } else if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    std::cerr << "--tls_cert: needs --tls_ca\n";
    return 2;
  }
  auto client = mlaserve::client::MlaServeClient::Connect(target, client_options);
  if (!client->WaitForConnected(absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s)))) {
    std::cerr << "mlaserve-loadgen: cannot connect to " << target << "\n";
    return 1;
  }
  auto load_target = mlaserve::loadgen::GrpcLoadTarget::Create(std::move(client));
  if (!load_target.ok()) {
    std::cerr << "mlaserve-loadgen: " << load_target.status() << "\n";
    return 1;
  }
  absl::StatusOr<mlaserve::loadgen::LoadResult> result =
      mlaserve::loadgen::RunWorkload(**load_target, o);
  if (!result.ok()) {
    std::cerr << "mlaserve-loadgen: " << result.status() << "\n";
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const mlaserve::loadgen::LoadSummary summary = mlaserve::loadgen::Summarize(*result);
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << mlaserve::loadgen::ToJson(*result, summary).dump() << "\n";
  } else {
    mlaserve::loadgen::PrintReport(*result, summary, target, std::cout);
  }
  return summary.failed_calls == 0 ? 0 : 1;
}
