#include "client/loadgen/load_report.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mlaserve::loadgen {
nlohmann::json ToJson(const Percentiles& p) {
  return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"max", p.max}, {"mean", p.mean}};
}

Percentiles PercentilesOf(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&v](double q) {
    const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
  };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p99 = at(0.99);
  p.max = v.back();
  p.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return p;
}

LoadSummary Summarize(const LoadResult& r) {
  LoadSummary s;
  std::vector<double> latency, queue, host, overhead, batch, modeled;
  int64_t queries = 0, hybrid = 0;
  double first_measured_s = r.wall_s;
  for (const CallRecord& c : r.calls) {
    if (c.warmup) {
      ++s.warmup_calls;
      continue;
    }
    first_measured_s = std::min(first_measured_s, c.start_s);
    ++s.calls;
    if (c.code != absl::StatusCode::kOk) {
      ++s.failed_calls;
      ++s.errors[absl::StatusCodeToString(c.code)];
      continue;
    }
    queries += c.queries;
    latency.push_back(c.latency_us / 1e3);
    // A call's queries share one device batch: its first answer speaks for all.
    const LoadAnswer& a = c.answers.front();
    queue.push_back(a.queue_us);
    host.push_back(a.device_host_us / 1e3);
    overhead.push_back(std::max(0.0, c.latency_us - a.queue_us - a.device_host_us));
    batch.push_back(a.batch_size);
    modeled.push_back(a.device_modeled_us);
    for (const LoadAnswer& x : c.answers) hybrid += x.hybrid ? 1 : 0;
  }
  // Rates over the measured part only: from the first call after warm-up to the end.
  s.wall_s = r.wall_s - first_measured_s;
  const int64_t warm_tokens = int64_t{r.options.workers} * r.options.sequences;
  if (s.wall_s > 0) {
    s.calls_per_s = static_cast<double>(s.calls - s.failed_calls) / s.wall_s;
    s.queries_per_s = static_cast<double>(queries) / s.wall_s;
    s.tokens_per_s = static_cast<double>(std::max<int64_t>(0, r.tokens - warm_tokens)) / s.wall_s;
  }
  s.latency_ms = PercentilesOf(latency);
  s.queue_us = PercentilesOf(queue);
  s.device_host_ms = PercentilesOf(host);
  s.overhead_us = PercentilesOf(overhead);
  s.mean_batch_size = PercentilesOf(batch).mean;
  s.mean_device_modeled_us = PercentilesOf(modeled).mean;
  s.hybrid_fraction =
      queries > 0 ? static_cast<double>(hybrid) / static_cast<double>(queries) : 0.0;
  return s;
}

nlohmann::json ToJson(const LoadResult& r, const LoadSummary& s) {
  const WorkloadOptions& o = r.options;
  return {
      {"model", r.model.name},
      {"workers", o.workers},
      {"sequences", o.sequences},
      {"prefix_tokens", o.prefix_tokens},
      {"context_tokens", o.context_tokens},
      {"sq", o.sq},
      {"space", o.head_space ? "head" : "latent"},
      {"transport", o.transport},
      {"kv_dtype", o.kv_dtype.has_value()                 ? KvDtypeName(*o.kv_dtype)
                   : r.model.default_kv_dtype.has_value() ? KvDtypeName(*r.model.default_kv_dtype)
                                                          : "server default"},
      {"wall_s", s.wall_s},
      {"calls", s.calls},
      {"warmup_calls", s.warmup_calls},
      {"failed_calls", s.failed_calls},
      {"errors", s.errors},
      {"calls_per_s", s.calls_per_s},
      {"queries_per_s", s.queries_per_s},
      {"tokens_per_s", s.tokens_per_s},
      {"latency_ms", ToJson(s.latency_ms)},
      {"queue_us", ToJson(s.queue_us)},
      {"device_host_ms", ToJson(s.device_host_ms)},
      {"overhead_us", ToJson(s.overhead_us)},
      {"mean_batch_size", s.mean_batch_size},
      {"mean_device_modeled_us", s.mean_device_modeled_us},
      {"hybrid_fraction", s.hybrid_fraction}};
}

// The format the run's KV was held in: the one asked for, else the server's default, named
// where the server says which it is.
std::string KvFormatPhrase(std::optional<KvDtype> asked, std::optional<KvDtype> server_default) {
  if (asked.has_value()) return KvDtypeName(*asked);
  if (server_default.has_value()) {
    return absl::StrCat(KvDtypeName(*server_default), " (the server's default)");
  }
  return "in the server's default format";
}

namespace {

std::string TransportPhrase(const std::string& transport) {
  if (transport == "grpc") return "gRPC (a message per query)";
  if (transport == "packed") return "gRPC (packed)";
  if (transport == "shm") return "the same-host data plane";
  if (transport == "ucx") return "the UCX data plane";
  return transport;
}

}  // namespace

void PrintReport(const LoadResult& r, const LoadSummary& s, const std::string& target,
                 std::ostream& out) {
  const WorkloadOptions& o = r.options;
  out << absl::StrFormat("mlaserve load test against %s\n", target);
  out << absl::StrFormat(
      "  workload   %s, %d workers x %d sequences, system prompt %d + own %d tokens, sq %d, "
      "%s-space q, KV %s, over %s, %.1f s\n",
      r.model.name, o.workers, o.sequences, o.prefix_tokens, o.context_tokens, o.sq,
      o.head_space ? "head" : "latent", KvFormatPhrase(o.kv_dtype, r.model.default_kv_dtype),
      TransportPhrase(o.transport), s.wall_s);
  out << absl::StrFormat("  calls      %d ok, %d failed (after %d warm-up calls)",
                         s.calls - s.failed_calls, s.failed_calls, s.warmup_calls);
  for (const auto& [code, n] : s.errors) out << absl::StrFormat("  [%s x%d]", code, n);
  out << "\n";
  out << absl::StrFormat(
      "  throughput %.1f calls/s, %.1f queries/s, %.1f tokens/s (sequence steps, all layers)\n",
      s.calls_per_s, s.queries_per_s, s.tokens_per_s);
  out << absl::StrFormat("  %-22s %10s %10s %10s %10s\n", "per call", "p50", "p90", "p99", "max");
  auto row = [&out](const char* name, const Percentiles& p, const char* unit) {
    out << absl::StrFormat("  %-22s %10.2f %10.2f %10.2f %10.2f %s\n", name, p.p50, p.p90, p.p99,
                           p.max, unit);
  };
  row("latency", s.latency_ms, "ms");
  row("queue wait", s.queue_us, "us");
  row("device host time", s.device_host_ms, "ms");
  row("RPC overhead", s.overhead_us, "us");
  out << absl::StrFormat(
      "  batches    %.1f queries per device batch on average, %.1f us modelled device time each\n",
      s.mean_batch_size, s.mean_device_modeled_us);
  out << absl::StrFormat(
      "  plans      %.0f%% of queries ran hybrid (TyphoonMLA), the rest absorb-only\n",
      100.0 * s.hybrid_fraction);
}

}  // namespace mlaserve::loadgen
