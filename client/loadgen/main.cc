// mlaserve-loadgen: drives a running mlaserve-server the way serving frameworks do and
// prints what a serving engineer asks about (throughput, latency percentiles, where the time
// went, how batches were planned). With --soak, a long run with a churn of sequences whose
// answers are checked against the fp64 golden while the server's resources are watched for
// drift. See docs/loadgen.md.
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/loadgen/continuous.h"
#include "client/loadgen/continuous_report.h"
#include "client/loadgen/default_ranks.h"
#include "client/loadgen/destination.h"
#include "client/loadgen/load_report.h"
#include "client/loadgen/soak.h"
#include "client/loadgen/soak_report.h"
#include "client/loadgen/sweep_output.h"
#include "client/loadgen/workload.h"
#include "client/mlaserve_client.h"
#include "client/transport_hint.h"
#include "common/command_line.h"
#include "kernels/core/cpu_features.h"
#include "kernels/core/matmul.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "server address, host:port; a comma-separated list spreads sequences over several "
          "servers (a system prompt's sequences kept together)");
ABSL_FLAG(std::string, spread, "prefix",
          "with several --target servers: prefix (a system prompt's sequences on its server) or "
          "sequence (plain hashing of each sequence's id, the prompt on every server)");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "a cluster instead of --target: etcd's host:port list; sequences are placed by the "
          "cluster client (docs/cluster.md)");
ABSL_FLAG(std::string, cluster, "default", "with --etcd-endpoints: the servers' --cluster");
ABSL_FLAG(std::string, etcd_ca, "", "with --etcd-endpoints: PEM CA of etcd's certificate (TLS)");
ABSL_FLAG(std::string, etcd_cert, "", "PEM client certificate for an etcd that requires one");
ABSL_FLAG(std::string, etcd_key, "", "PEM private key of --etcd-cert");
ABSL_FLAG(int, spread_group, -1,
          "with --etcd-endpoints: a prompt's sequences per server before it is registered on "
          "another (-1: twice the servers' B_theta; 0: only when a server is full)");
ABSL_FLAG(bool, client_per_rank, false,
          "with --etcd-endpoints: one cluster client per worker, as data-parallel ranks that "
          "each place their own sequences (a prompt's group then stays within a rank's calls)");
ABSL_FLAG(bool, placement_groups, true,
          "with --etcd-endpoints: each rank's sequences are a placement group, kept on one "
          "server and spread over the servers through claims in etcd that every client sees "
          "(false: each client places alone on the servers' records)");
ABSL_FLAG(double, rebalance_interval_s, 0,
          "with --etcd-endpoints and placement groups: each cluster client moves its groups off "
          "servers past the load bound this often (0: never; docs/cluster.md, \"Rebalancing\")");
ABSL_FLAG(int64_t, context_part_tokens, 0,
          "with --etcd-endpoints: positions per server of a context-parallel sequence (0: one "
          "server each)");
ABSL_FLAG(std::string, workers, "auto",
          "concurrent callers (serving-framework ranks), one call in flight each: N, or auto "
          "(as many as the server's pool serves best: one per emulated device, 8 per GPU, at "
          "least 2; learnt from GetServerInfo)");
ABSL_FLAG(int, sequences, 72, "sequences per worker, all decoded in every call");
ABSL_FLAG(int, prefix_tokens, 1024,
          "tokens of the system prompt every sequence starts on (0: none)");
ABSL_FLAG(int, context_tokens, 128, "tokens of each sequence's own prompt");
ABSL_FLAG(int, sq, 1, "query tokens per query (MTP)");
ABSL_FLAG(std::string, transport, "auto",
          "how each step's call travels: grpc (a message per query), packed (one packed "
          "message over gRPC), shm (packed, over the server's same-host data plane), ucx "
          "(packed, over the server's UCX data plane, across hosts), or auto (packed, over "
          "the same-host plane when the server offers one on this host, else over its UCX "
          "plane when it offers one this client reaches)");
ABSL_FLAG(std::string, space, "head", "query space: head (q_nope, q_pe) or latent (FlashMLA's q)");
ABSL_FLAG(int, layers, 0, "layers each step visits (0: every layer the server serves)");
ABSL_FLAG(std::string, kv_dtype, "",
          "KV format of the run's prefix and sequences: bf16 or fp8 (empty: the server's default)");
ABSL_FLAG(double, duration_s, 10, "how long to run");
ABSL_FLAG(double, connect_timeout_s, 30, "how long to wait for the server");
ABSL_FLAG(uint64_t, seed, 1, "seed of the generated queries and KV rows");
ABSL_FLAG(std::string, run_id, "loadgen", "prefix of every id the run creates");
ABSL_FLAG(bool, json, false, "print the summary as one JSON object");
ABSL_FLAG(bool, quiet, false,
          "no progress on stderr (by default: a live line on a terminal, a line every 10 s "
          "otherwise)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the server's certificate: TLS (else plaintext)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate, for servers that require one (mTLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the server's certificate carries, when it is not the target's host");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding the tenant's bearer token, for a server with --auth_tokens_file (a file, "
          "so the token is not in the process list)");

ABSL_FLAG(bool, soak, false,
          "soak mode: churn of sequences at saturation for --duration-s, answers checked "
          "against the fp64 golden, the server's RSS/threads/fds read from --metrics-target");
ABSL_FLAG(std::string, metrics_target, "",
          "soak: host:port of the server's Prometheus endpoint (its --metrics_listen)");
ABSL_FLAG(int, soak_check_every, 10,
          "soak: check every answer of every N-th decode call of each worker");
ABSL_FLAG(double, soak_sample_s, 5, "soak: seconds between reads of the server's /metrics");
ABSL_FLAG(double, soak_warmup_s, 60, "soak: seconds at the start left out of the resource drift");
ABSL_FLAG(std::string, soak_max_rss_drift, "auto",
          "soak: largest RSS drift outside the KV pool (last window mean - first window mean) "
          "/ first that passes; auto: 0.05 for a run measuring 300 s or more after a warm-up of "
          "60 s or more (the defaults), 0.15 for a shorter one");
ABSL_FLAG(int, soak_min_life, 4, "soak: fewest decode steps a sequence lives");
ABSL_FLAG(int, soak_max_life, 64, "soak: most decode steps a sequence lives");
ABSL_FLAG(double, soak_prefix_fraction, 0.7,
          "soak: share of new sequences created on the shared prefix (the rest bare)");
ABSL_FLAG(double, soak_fork_fraction, 0.2,
          "soak: share of retired sequences replaced by a fork of a live one");
ABSL_FLAG(bool, continuous, false,
          "continuous traffic: sequences arrive, decode their steps and retire (implied by "
          "--sweep and by --arrival-rate above 0)");
ABSL_FLAG(double, arrival_rate, 0,
          "continuous: sequences arriving per second (0: a closed population, each rank kept at "
          "--sequences)");
ABSL_FLAG(double, burstiness, 1,
          "continuous: Gamma shape of the arrival gaps (1 Poisson, below 1 burstier, above 1 "
          "more regular)");
ABSL_FLAG(std::string, context_dist, "",
          "continuous: each sequence's own prompt tokens: fixed:N, uniform:A,B, "
          "lognormal:MEDIAN,SIGMA or file:PATH (default fixed:--context-tokens)");
ABSL_FLAG(std::string, steps_dist, "uniform:16,256",
          "continuous: decode steps (output tokens) per sequence, same forms as --context-dist");
ABSL_FLAG(int, max_context_tokens, 8192, "continuous: largest own prompt a draw may give");
ABSL_FLAG(std::string, system_prompts, "",
          "continuous: shared system prompts as TOKENS:WEIGHT,... (default one of "
          "--prefix-tokens; 0 for none)");
ABSL_FLAG(double, slo_tpot_ms, 0,
          "continuous: time-per-output-token SLO for goodput and the sweep's stop (0: none)");
ABSL_FLAG(double, warmup_s, 2, "continuous: seconds run before measuring (each sweep point)");
ABSL_FLAG(std::string, sweep, "",
          "continuous: VARIABLE:V1,V2,... over rate, ranks (--workers) or sequences (per rank), "
          "one measured point each, stopping once the SLO is lost for good");
ABSL_FLAG(std::string, out, "",
          "continuous: write PREFIX.json and PREFIX.csv (docs/loadgen.md, \"Sweeps\")");

namespace {

// Whether `flag` was given a value other than its default. (This abseil keeps "specified on
// the command line" private; a flag set to its own default counts as unset, which only
// matters where the soak's default differs, and is documented there.)
bool Specified(absl::string_view flag) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(flag);
  return f != nullptr && f->CurrentValue() != f->DefaultValue();
}

// --workers: a number of ranks, or 0 for auto; -1 where it is neither.
int WorkersFlag() {
  const std::string text = absl::GetFlag(FLAGS_workers);
  if (text == "auto") return 0;
  int workers = 0;
  return absl::SimpleAtoi(text, &workers) && workers >= 1 ? workers : -1;
}

// Validates the soak's flags (naming the flag), runs it and prints the report. The exit
// status: 0 passed, 1 failed (wrong answer, unexpected error, drift), 2 bad flags.
int RunSoakMode(mlaserve::client::MlaServeClient& client, const std::string& target,
                const mlaserve::client::ClientTls& tls) {
  using mlaserve::loadgen::SoakOptions;
  SoakOptions o;
  // The workload flags keep their meaning; where unset, the soak's own defaults apply (the
  // closed-loop load's 72 sequences on 1024 prefix tokens would make every golden check slow).
  o.workers = WorkersFlag() == 0 ? mlaserve::loadgen::kMinRanks : WorkersFlag();
  o.sequences = Specified("sequences") ? absl::GetFlag(FLAGS_sequences) : 8;
  o.prefix_tokens = Specified("prefix_tokens") ? absl::GetFlag(FLAGS_prefix_tokens) : 256;
  o.max_prompt = Specified("context_tokens") ? absl::GetFlag(FLAGS_context_tokens) : 64;
  o.min_prompt = 1;
  o.sq = absl::GetFlag(FLAGS_sq);
  o.layers = absl::GetFlag(FLAGS_layers);
  o.duration = absl::Seconds(Specified("duration_s") ? absl::GetFlag(FLAGS_duration_s) : 600);
  o.check_every = absl::GetFlag(FLAGS_soak_check_every);
  o.sample_s = absl::GetFlag(FLAGS_soak_sample_s);
  o.warmup_s = absl::GetFlag(FLAGS_soak_warmup_s);
  o.min_life = absl::GetFlag(FLAGS_soak_min_life);
  o.max_life = absl::GetFlag(FLAGS_soak_max_life);
  o.prefix_fraction = absl::GetFlag(FLAGS_soak_prefix_fraction);
  o.fork_fraction = absl::GetFlag(FLAGS_soak_fork_fraction);
  o.metrics_target = absl::GetFlag(FLAGS_metrics_target);
  o.metrics_tls = tls;
  o.seed = absl::GetFlag(FLAGS_seed);
  o.run_id = Specified("run_id") ? absl::GetFlag(FLAGS_run_id) : "soak";
  auto bad = [](absl::string_view flag, absl::string_view why) {
    std::cerr << "--" << flag << ": " << why << "\n";
    return 2;
  };
  if (absl::GetFlag(FLAGS_space) != "latent" && Specified("space")) {
    return bad("space", "the soak checks latent-space answers (FlashMLA's q) only");
  }
  if (!absl::GetFlag(FLAGS_kv_dtype).empty() && absl::GetFlag(FLAGS_kv_dtype) != "bf16") {
    return bad("kv_dtype",
               "the soak holds its sequences in the bf16 cache, whose bounds it checks");
  }
  if (o.workers < 1) return bad("workers", "must be at least 1, or auto");
  if (o.sequences < 1) return bad("sequences", "must be at least 1");
  if (o.prefix_tokens < 0) return bad("prefix_tokens", "must be 0 (no prefix) or more");
  if (o.max_prompt < 1)
    return bad("context_tokens", "the soak's own prompts need at least 1 token");
  if (o.sq < 1) return bad("sq", "must be at least 1");
  if (!(absl::ToDoubleSeconds(o.duration) > 0)) return bad("duration_s", "must be positive");
  if (o.check_every < 1) return bad("soak_check_every", "must be at least 1");
  if (!(o.sample_s > 0)) return bad("soak_sample_s", "must be positive");
  if (!(o.warmup_s >= 0)) return bad("soak_warmup_s", "must be 0 or more");
  if (!(o.warmup_s < absl::ToDoubleSeconds(o.duration))) {
    return bad("soak_warmup_s", "must be shorter than --duration-s");
  }
  if (const std::string limit = absl::GetFlag(FLAGS_soak_max_rss_drift); limit == "auto") {
    o.max_rss_drift =
        mlaserve::loadgen::DefaultMaxRssDrift(absl::ToDoubleSeconds(o.duration), o.warmup_s);
  } else if (!absl::SimpleAtod(limit, &o.max_rss_drift)) {
    return bad("soak_max_rss_drift", "must be a fraction (0.05 is 5 %) or auto");
  }
  if (!(o.max_rss_drift >= 0)) return bad("soak_max_rss_drift", "must be 0 or more");
  if (o.min_life < 1) return bad("soak_min_life", "must be at least 1");
  if (o.max_life < o.min_life) return bad("soak_max_life", "must be at least --soak-min-life");
  if (!(o.prefix_fraction >= 0 && o.prefix_fraction <= 1)) {
    return bad("soak_prefix_fraction", "must be in [0, 1]");
  }
  if (!(o.fork_fraction >= 0 && o.fork_fraction <= 1)) {
    return bad("soak_fork_fraction", "must be in [0, 1]");
  }
  if (o.metrics_target.empty()) {
    return bad("metrics_target",
               "the soak needs the server's /metrics (host:port of its --metrics_listen)");
  }
  absl::StatusOr<mlaserve::loadgen::SoakResult> result = mlaserve::loadgen::RunSoak(client, o);
  if (!result.ok()) {
    std::cerr << "mlaserve-loadgen --soak: " << result.status() << "\n";
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << mlaserve::loadgen::SoakToJson(*result).dump() << "\n";
  } else {
    mlaserve::loadgen::PrintSoakReport(*result, target, std::cout);
  }
  return result->failures.empty() ? 0 : 1;
}

mlaserve::loadgen::ClusterFlags ClusterFlags() {
  mlaserve::loadgen::ClusterFlags f;
  f.etcd_endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
  f.cluster = absl::GetFlag(FLAGS_cluster);
  f.etcd_ca = absl::GetFlag(FLAGS_etcd_ca);
  f.etcd_cert = absl::GetFlag(FLAGS_etcd_cert);
  f.etcd_key = absl::GetFlag(FLAGS_etcd_key);
  f.spread_group = absl::GetFlag(FLAGS_spread_group);
  f.context_part_tokens = absl::GetFlag(FLAGS_context_part_tokens);
  f.placement_groups = absl::GetFlag(FLAGS_placement_groups);
  f.rebalance_interval_s = absl::GetFlag(FLAGS_rebalance_interval_s);
  f.client_per_rank = absl::GetFlag(FLAGS_client_per_rank);
  return f;
}

std::string CommandLine(int argc, char** argv) {
  std::vector<std::string> words(argv, argv + argc);
  return absl::StrJoin(words, " ");
}

// Continuous traffic, one run or a sweep (docs/loadgen.md). Exit status: 0 when every call
// succeeded, 1 otherwise or when the run fails, 2 for bad flags.
int RunContinuousMode(const mlaserve::loadgen::WorkloadOptions& base,
                      mlaserve::loadgen::Destination destination, const std::string& command) {
  const std::string& target = destination.name;
  using mlaserve::loadgen::ContinuousOptions;
  auto bad = [](const absl::Status& status) {
    std::cerr << "mlaserve-loadgen: " << status.message() << "\n";
    return 2;
  };
  ContinuousOptions o;
  // The flags both modes share, as main already parsed and checked them.
  o.ranks = base.workers;
  o.sequences = base.sequences;
  o.sq = base.sq;
  o.head_space = base.head_space;
  o.layers = base.layers;
  o.seed = base.seed;
  o.run_id = base.run_id;
  o.kv_dtype = base.kv_dtype;
  const double duration_s = absl::GetFlag(FLAGS_duration_s);
  const double warmup_s = absl::GetFlag(FLAGS_warmup_s);
  if (!(duration_s > 0)) return bad(absl::InvalidArgumentError("--duration-s: must be positive"));
  if (!(warmup_s >= 0)) return bad(absl::InvalidArgumentError("--warmup-s: must be 0 or more"));
  o.duration = absl::Seconds(duration_s);
  o.warmup = absl::Seconds(warmup_s);
  const int max_context = absl::GetFlag(FLAGS_max_context_tokens);
  if (max_context < 1) {
    return bad(absl::InvalidArgumentError("--max-context-tokens: must be at least 1"));
  }
  std::string context = absl::GetFlag(FLAGS_context_dist);
  if (context.empty()) {
    if (absl::GetFlag(FLAGS_context_tokens) < 1) {
      return bad(absl::InvalidArgumentError(
          "--context-tokens: continuous traffic needs at least 1 own token per sequence (or a "
          "--context-dist)"));
    }
    context = absl::StrCat("fixed:", absl::GetFlag(FLAGS_context_tokens));
  }
  absl::StatusOr<mlaserve::loadgen::LengthDistribution> context_dist =
      mlaserve::loadgen::LengthDistribution::Parse(context, "context-dist", max_context);
  if (!context_dist.ok()) return bad(context_dist.status());
  o.context = *std::move(context_dist);
  absl::StatusOr<mlaserve::loadgen::LengthDistribution> steps_dist =
      mlaserve::loadgen::LengthDistribution::Parse(absl::GetFlag(FLAGS_steps_dist), "steps-dist",
                                                   1 << 20);
  if (!steps_dist.ok()) return bad(steps_dist.status());
  o.steps = *std::move(steps_dist);
  std::string prompts = absl::GetFlag(FLAGS_system_prompts);
  if (prompts.empty()) prompts = absl::StrCat(absl::GetFlag(FLAGS_prefix_tokens));
  absl::StatusOr<mlaserve::loadgen::PromptMix> mix = mlaserve::loadgen::PromptMix::Parse(prompts);
  if (!mix.ok()) return bad(mix.status());
  o.prompts = *std::move(mix);
  absl::StatusOr<mlaserve::loadgen::ArrivalProcess> arrivals =
      mlaserve::loadgen::ArrivalProcess::Create(absl::GetFlag(FLAGS_arrival_rate),
                                                absl::GetFlag(FLAGS_burstiness));
  if (!arrivals.ok()) return bad(arrivals.status());
  o.arrivals = *arrivals;
  const double slo = absl::GetFlag(FLAGS_slo_tpot_ms);
  if (!(slo >= 0)) return bad(absl::InvalidArgumentError("--slo-tpot-ms: must be 0 or more"));
  const std::optional<double> slo_tpot_ms = slo > 0 ? std::optional<double>(slo) : std::nullopt;
  std::optional<mlaserve::loadgen::SweepSpec> sweep;
  if (const std::string spec = absl::GetFlag(FLAGS_sweep); !spec.empty()) {
    absl::StatusOr<mlaserve::loadgen::SweepSpec> parsed = mlaserve::loadgen::SweepSpec::Parse(spec);
    if (!parsed.ok()) return bad(parsed.status());
    sweep = *std::move(parsed);
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  // A long sweep's results must not be lost at its end: the folder is made now, and a place
  // that cannot be written is refused before the first point runs.
  if (!out.empty()) {
    if (absl::Status writable = mlaserve::loadgen::PrepareSweepOutput(out); !writable.ok())
      return bad(writable);
  }

  mlaserve::loadgen::SweepContext context_info{command, mlaserve::loadgen::ClientMachine(),
                                               destination.servers};
  mlaserve::loadgen::LoadTarget* const load_target = destination.target.get();
  const bool json = absl::GetFlag(FLAGS_json);
  const std::vector<double> values =
      sweep.has_value() ? sweep->values : std::vector<double>{std::nan("")};
  std::vector<mlaserve::loadgen::PointSummary> points;
  bool stopped_early = false;
  bool run_failed = false;
  std::string stop_reason;
  int64_t failed_calls = 0;
  if (sweep.has_value() && !json) {
    std::cout << absl::StrFormat(
                     "mlaserve sweep against %s: %s (%s), %.0f s per point after "
                     "%.0f s of warm-up\n",
                     target, sweep->variable, sweep->unit(), duration_s, warmup_s)
              << mlaserve::loadgen::SweepTableHeader(&*sweep) << std::endl;
  }
  for (double value : values) {
    ContinuousOptions point = sweep.has_value() ? sweep->Apply(o, value) : o;
    point.run_id = sweep.has_value() ? absl::StrCat(o.run_id, "/", points.size()) : o.run_id;
    absl::StatusOr<mlaserve::loadgen::ContinuousResult> result;
    {
      mlaserve::loadgen::Progress progress(
          mlaserve::loadgen::ProgressModeFor(absl::GetFlag(FLAGS_quiet), STDERR_FILENO), std::cerr);
      point.progress = &progress;
      result = mlaserve::loadgen::RunContinuous(*load_target, point);
    }
    if (!result.ok()) {
      std::cerr << "mlaserve-loadgen: " << result.status() << "\n";
      if (points.empty()) {
        return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
      }
      // The points measured so far still go to --out, with the reason the sweep ended.
      run_failed = true;
      stopped_early = true;
      stop_reason = absl::StrCat("the point at ", value, " failed: ", result.status().message());
      break;
    }
    points.push_back(mlaserve::loadgen::SummarizePoint(
        *result, sweep.has_value() ? std::optional<double>(value) : std::nullopt, slo_tpot_ms));
    failed_calls += points.back().failed_calls + points.back().refused_admissions;
    if (!json) {
      if (sweep.has_value()) {
        std::cout << mlaserve::loadgen::SweepTableRow(points.back()) << std::endl;
      } else {
        mlaserve::loadgen::PrintPointReport(*result, points.back(), target, std::cout);
      }
    }
    if (sweep.has_value() && mlaserve::loadgen::SloLostForGood(points) &&
        points.size() < values.size()) {
      stopped_early = true;
      stop_reason = absl::StrFormat(
          "p50 TPOT over the %.3g ms SLO at two points in a row: more load cannot bring it back",
          *slo_tpot_ms);
      break;
    }
  }
  const nlohmann::json report = mlaserve::loadgen::SweepJson(
      context_info, sweep.has_value() ? &*sweep : nullptr, points, stopped_early, stop_reason);
  if (json) {
    std::cout << report.dump() << "\n";
  } else if (sweep.has_value()) {
    if (stopped_early) std::cout << "  stopped early: " << stop_reason << "\n";
    if (const std::optional<mlaserve::loadgen::Knee> knee = mlaserve::loadgen::FindKnee(points)) {
      std::cout << "  knee       " << sweep->variable << " " << *points[knee->index].value << ": "
                << knee->reason << "\n";
    }
  }
  if (!out.empty()) {
    std::ofstream json_file(out + ".json"), csv_file(out + ".csv");
    json_file << report.dump(1) << "\n";
    csv_file << mlaserve::loadgen::SweepCsv(context_info, points);
    if (!json_file || !csv_file) {
      std::cerr << "mlaserve-loadgen: --out: cannot write " << out << ".json and .csv\n";
      return 1;
    }
    if (!json) std::cout << "  wrote      " << out << ".json, " << out << ".csv\n";
  }
  return failed_calls == 0 && !run_failed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Reports (and --json) own stdout; the cluster client's log lines go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("mlaserve-loadgen"));
  absl::SetProgramUsageMessage(
      "mlaserve-loadgen [--target host:port] [flags]: closed-loop decode load; with "
      "--continuous (or --arrival-rate, --sweep), traffic that arrives and retires; with --soak "
      "--metrics-target host:port, a soak run (docs/loadgen.md)");
  // Flag names take dashes or underscores (--duration-s = --duration_s), and --flagfile.
  absl::StatusOr<std::vector<std::string>> positional =
      mlaserve::ParseFlags(argc, argv, mlaserve::MatrixPathDescription);
  if (!positional.ok() || !positional->empty()) {
    std::cerr << "mlaserve-loadgen: "
              << (positional.ok() ? "unexpected argument " + positional->front()
                                  : positional.status().ToString())
              << "\n";
    return 2;
  }
  using mlaserve::loadgen::WorkloadOptions;
  WorkloadOptions o;
  o.workers = WorkersFlag();
  if (o.workers < 0) {
    std::cerr << "--workers: '" << absl::GetFlag(FLAGS_workers)
              << "' is not a number of ranks (at least 1) or auto\n";
    return 2;
  }
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
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    std::ifstream in(path);
    std::string token;
    if (!in || !std::getline(in, token) || token.empty()) {
      std::cerr << "--auth_token_file: cannot read a token from '" << path << "'\n";
      return 2;
    }
    client_options.bearer_token = token;
  }
  const std::string transport = absl::GetFlag(FLAGS_transport);
  using Plane = mlaserve::client::ClientOptions::DataPlane;
  const std::map<std::string, Plane> planes = {{"grpc", Plane::kGrpc},
                                               {"packed", Plane::kGrpc},
                                               {"shm", Plane::kShm},
                                               {"ucx", Plane::kUcx},
                                               {"auto", Plane::kAuto}};
  if (!planes.contains(transport)) {
    std::cerr << "--transport: '" << transport << "' is not grpc, packed, shm, ucx or auto\n";
    return 2;
  }
  const bool packed = transport != "grpc";
  client_options.data_plane = planes.at(transport);
  o.transport = transport;
  // A soak counts every failed call, so the client must not hide one behind a retry.
  if (absl::GetFlag(FLAGS_soak)) client_options.max_attempts = 1;
  const bool cluster = !absl::GetFlag(FLAGS_etcd_endpoints).empty();
  if (absl::GetFlag(FLAGS_soak) && cluster) {
    std::cerr << "--etcd_endpoints: the soak takes one server (--target)\n";
    return 2;
  }
  const std::vector<std::string> names = absl::StrSplit(target, ',');
  if (absl::GetFlag(FLAGS_soak) && names.size() > 1) {
    std::cerr << "--target: the soak takes one server\n";
    return 2;
  }
  std::vector<std::unique_ptr<mlaserve::client::MlaServeClient>> clients;
  for (const std::string& name : cluster ? std::vector<std::string>{} : names) {
    if (name.empty()) {
      std::cerr << "--target: an empty address in '" << target << "'\n";
      return 2;
    }
    clients.push_back(mlaserve::client::MlaServeClient::Connect(name, client_options));
    if (const absl::Status connected = mlaserve::client::WaitForServer(
            *clients.back(), absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s)),
            client_options.tls.enabled());
        !connected.ok()) {
      std::cerr << "mlaserve-loadgen: cannot connect to " << name << ": " << connected.message()
                << "\n";
      return 1;
    }
  }
  if (transport == "auto") {
    // What auto found, for the report: the plane, or gRPC's packed form.
    o.transport = cluster                                     ? "packed"
                  : clients.front()->SharedMemoryPlane().ok() ? "shm"
                  : clients.front()->UcxPlane().ok()          ? "ucx"
                                                              : "packed";
  }
  const mlaserve::client::ClientTls tls = client_options.tls;
  if (absl::GetFlag(FLAGS_soak)) return RunSoakMode(*clients.front(), target, tls);
  absl::StatusOr<mlaserve::loadgen::Destination> destination =
      cluster
          ? mlaserve::loadgen::ClusterDestination(client_options, ClusterFlags(), o.workers, packed)
          : mlaserve::loadgen::TargetDestination(std::move(clients), names, target,
                                                 absl::GetFlag(FLAGS_spread), packed);
  if (!destination.ok()) {
    std::cerr << "mlaserve-loadgen: " << destination.status() << "\n";
    return absl::IsInvalidArgument(destination.status()) ? 2 : 1;
  }
  if (o.workers == 0) o.workers = destination->default_ranks;
  if (absl::GetFlag(FLAGS_continuous) || !absl::GetFlag(FLAGS_sweep).empty() ||
      absl::GetFlag(FLAGS_arrival_rate) > 0) {
    return RunContinuousMode(o, *std::move(destination), CommandLine(argc, argv));
  }
  absl::StatusOr<mlaserve::loadgen::LoadResult> result;
  {
    // Ends (and finishes its line) before the report is printed.
    mlaserve::loadgen::Progress progress(
        mlaserve::loadgen::ProgressModeFor(absl::GetFlag(FLAGS_quiet), STDERR_FILENO), std::cerr);
    o.progress = &progress;
    result = mlaserve::loadgen::RunWorkload(*destination->target, o);
    o.progress = nullptr;
  }
  if (!result.ok()) {
    std::cerr << "mlaserve-loadgen: " << result.status() << "\n";
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const mlaserve::loadgen::LoadSummary summary = mlaserve::loadgen::Summarize(*result);
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << mlaserve::loadgen::ToJson(*result, summary).dump() << "\n";
  } else {
    mlaserve::loadgen::PrintReport(*result, summary, destination->name, std::cout);
  }
  return summary.failed_calls == 0 ? 0 : 1;
}
