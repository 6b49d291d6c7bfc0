#ifndef MLASERVE_CLIENT_LOADGEN_SOAK_H_
#define MLASERVE_CLIENT_LOADGEN_SOAK_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/loadgen/resource_drift.h"
#include "client/loadgen/soak_check.h"
#include "client/loadgen/soak_churn.h"
#include "client/mlaserve_client.h"

namespace mlaserve::loadgen {

// A soak run (docs/loadgen.md, "Soak"): `workers` callers keep the server saturated (each
// always has a call in flight) with a churn of sequences (create on the shared prefix or
// bare, append a prompt, fork, decode with appends, release on retirement, replace) for
// `duration`; every `check_every`-th decode call of a worker has all its answers checked
// against the fp64 golden; the server's RSS, threads and open descriptors are read from its
// /metrics every `sample_s`.
struct SoakOptions {
  int workers = 2;
  int sequences = 8;        // live per worker
  int prefix_tokens = 256;  // the shared prefix (0: none)
  int min_prompt = 1, max_prompt = 64;
  int min_life = 4, max_life = 64;
  double prefix_fraction = 0.7;
  double fork_fraction = 0.2;
  int sq = 1;
  int layers = 0;  // 0: every layer the server serves
  absl::Duration duration = absl::Minutes(10);
  int check_every = 10;
  double sample_s = 5;
  double warmup_s = 60;
  double max_rss_drift = 0.05;  // DefaultMaxRssDrift where --soak-max-rss-drift is auto
  std::string metrics_target;   // host:port of the server's /metrics
  // /metrics follows the gRPC port's security: the same CA and client certificate reach it.
  client::ClientTls metrics_tls;
  uint64_t seed = 1;
  std::string run_id = "soak";
};

struct SoakResult {
  SoakOptions options;
  std::string model;
  int heads = 0, dk = 0, dl = 0, layers = 0;
  double softmax_scale = 0;
  double wall_s = 0;
  int64_t calls = 0;  // every RPC the workers made, failed ones included
  std::map<std::string, int64_t> calls_by_rpc;
  int64_t decode_queries = 0;
  ChurnCounts churn;  // summed over workers
  int64_t checked_answers = 0;
  int64_t wrong_answers = 0;
  int64_t skipped_checks = 0;  // answers due a check while the checker was behind
  AnswerCheck worst;           // largest errors over every checked answer
  std::string first_wrong;     // what the first wrong answer was, for the report
  // Failed calls by gRPC status code name. The run stays below every admission limit the
  // server announces (queue, batch, KV budget), so none of them is expected.
  std::map<std::string, int64_t> errors;
  std::string first_error;
  std::vector<ResourceSample> samples;
  int64_t scrape_failures = 0;
  std::string first_scrape_error;
  std::optional<ResourceDrift> drift;
  std::string drift_error;  // why there is no drift
  // Why the run failed (wrong answers, errors, drift over the bound, ...); empty: it passed.
  std::vector<std::string> failures;
};

// Runs the soak on `client` and releases everything it created (also when it fails).
// INVALID_ARGUMENT naming the flag for options the server cannot take (more live sequences
// than its batch or queue holds, a peak KV footprint over its budget, ...).
absl::StatusOr<SoakResult> RunSoak(client::MlaServeClient& client, const SoakOptions& options);

// The RSS drift a run of `duration_s` with `warmup_s` left out passes at by default
// (--soak-max-rss-drift=auto): kLongRunMaxRssDrift for a run that measures at least
// kLongRunMeasuredS after a warm-up of at least kLongRunWarmupS (the soak's defaults, 600 s
// and 60 s), kShortRunMaxRssDrift otherwise. In its first minutes a server's RSS still grows
// by a few per cent with no leak (glibc's per-thread arenas meeting their first large
// batches, gRPC's threads reaching their working number: +6.6 % from 10 to 30 s on the
// 2-core machine), which a short run cannot average out; a leak search wants the long run.
inline constexpr double kLongRunMaxRssDrift = 0.05;
inline constexpr double kShortRunMaxRssDrift = 0.15;
inline constexpr double kLongRunMeasuredS = 300;
inline constexpr double kLongRunWarmupS = 60;
double DefaultMaxRssDrift(double duration_s, double warmup_s);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_SOAK_H_
