#include "client/loadgen/continuous_report.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace mlaserve::loadgen {
namespace {

constexpr size_t kCdfPoints = 200;

std::vector<double> Thinned(std::vector<double> sorted) {
  if (sorted.size() <= kCdfPoints) return sorted;
  std::vector<double> out(kCdfPoints);
  for (size_t i = 0; i < kCdfPoints; ++i) {
    out[i] = sorted[(i * (sorted.size() - 1)) / (kCdfPoints - 1)];
  }
  return out;
}

nlohmann::json OrNull(const std::optional<double>& v) {
  return v.has_value() ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// One CSV field (RFC 4180): quoted, with quotes doubled, when it holds a separator, a quote or
// a line break.
std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

// `object[key]` as CSV text: a string as it is, a number as JSON writes it, empty when absent
// (a server whose GetServerInfo failed, a proto3 field left at its default).
std::string CsvValue(const nlohmann::json& object, std::initializer_list<const char*> path) {
  const nlohmann::json* node = &object;
  for (const char* key : path) {
    if (!node->is_object() || !node->contains(key)) return "";
    node = &(*node)[key];
  }
  if (node->is_string()) return CsvField(node->get<std::string>());
  if (node->is_number() || node->is_boolean()) return node->dump();
  return "";
}

// The columns every row repeats: what ran the sweep (SweepCsvHeader names them).
std::string ContextColumns(const SweepContext& c) {
  return absl::StrJoin(
      {CsvValue(c.server, {"version"}), CsvValue(c.server, {"info", "state", "instance_id"}),
       CsvValue(c.server, {"model"}), CsvValue(c.server, {"layers"}),
       CsvValue(c.server, {"devices"}), CsvValue(c.server, {"device"}), CsvValue(c.server, {"cpu"}),
       CsvValue(c.server, {"matrix_unit"}),
       c.server.contains("servers") ? CsvValue(c.server, {"servers"}) : "1",
       CsvValue(c.client, {"cpu"}), CsvValue(c.client, {"isa"}), CsvValue(c.client, {"cores"}),
       CsvValue(c.client, {"hostname"})},
      ",");
}

}  // namespace

PointSummary SummarizePoint(const ContinuousResult& r, std::optional<double> value,
                            std::optional<double> slo_tpot_ms) {
  PointSummary p;
  p.value = value;
  p.slo_tpot_ms = slo_tpot_ms;
  p.warmup_s = r.warmup_s;
  p.measured_s = r.end_s - r.warmup_s;
  auto in_window = [&r](double t) { return t >= r.warmup_s && t <= r.end_s; };

  std::vector<double> latency, queue, modeled, host;
  int64_t queries = 0, hybrid = 0;
  double queue_sum = 0, host_sum = 0, latency_sum = 0;
  for (const CallRecord& c : r.calls) {
    if (!in_window(c.start_s)) continue;
    ++p.calls;
    if (c.code != absl::StatusCode::kOk) {
      ++p.failed_calls;
      ++p.errors[absl::StatusCodeToString(c.code)];
      continue;
    }
    queries += c.queries;
    latency.push_back(c.latency_us);
    if (c.answers.empty()) continue;
    // A call's queries share one device batch: its first answer speaks for all.
    const LoadAnswer& a = c.answers.front();
    queue.push_back(a.queue_us);
    modeled.push_back(a.device_modeled_us);
    host.push_back(a.device_host_us);
    latency_sum += c.latency_us;
    queue_sum += std::min(a.queue_us, c.latency_us);
    host_sum += std::min(a.device_host_us, std::max(0.0, c.latency_us - a.queue_us));
    for (const LoadAnswer& x : c.answers) hybrid += x.hybrid ? 1 : 0;
  }
  for (const AdmissionError& e : r.admission_errors) {
    if (!in_window(e.t_s)) continue;
    ++p.refused_admissions;
    ++p.errors[e.code];
  }
  p.call_latency_us = PercentilesOf(latency);
  p.queue_us = PercentilesOf(queue);
  p.device_modeled_us = PercentilesOf(modeled);
  p.device_host_us = PercentilesOf(host);
  if (latency_sum > 0) {
    p.share_queue = queue_sum / latency_sum;
    p.share_device = host_sum / latency_sum;
    p.share_overhead = std::max(0.0, 1.0 - p.share_queue - p.share_device);
  }
  p.hybrid_fraction = queries > 0 ? static_cast<double>(hybrid) / static_cast<double>(queries) : 0;

  int64_t good_tokens = 0;
  for (const StepRecord& s : r.steps) {
    if (!in_window(s.end_s)) continue;
    p.tokens += s.sequences;
    if (slo_tpot_ms.has_value() && s.ms <= *slo_tpot_ms) good_tokens += s.sequences;
  }
  std::vector<double> tpot, admission_wait;
  int64_t good_sequences = 0;
  for (const SequenceRecord& s : r.sequences) {
    if (in_window(s.arrived_s)) ++p.arrived;
    if (s.admitted_s >= 0 && in_window(s.admitted_s)) {
      admission_wait.push_back((s.admitted_s - s.arrived_s) * 1e3);
    }
    if (s.finished_s >= 0 && in_window(s.finished_s) && s.steps > 0) {
      ++p.finished;
      const double t = s.step_ms_sum / s.steps;
      tpot.push_back(t);
      if (slo_tpot_ms.has_value() && t <= *slo_tpot_ms) ++good_sequences;
    } else if (s.abandoned) {
      if (s.admitted_s >= 0) ++p.abandoned;
    } else if (s.admitted_s >= 0 && s.admitted_s <= r.end_s && s.finished_s < 0) {
      ++p.unfinished;
      // Still decoding at the end: its steps so far count, or a window shorter than the
      // sequences' lives would measure only the short ones.
      if (s.steps > 0) {
        const double t = s.step_ms_sum / s.steps;
        tpot.push_back(t);
        if (slo_tpot_ms.has_value() && t <= *slo_tpot_ms) ++good_sequences;
      }
    }
  }
  const size_t measured_sequences = tpot.size();
  p.tpot_ms = PercentilesOf(tpot);
  p.admission_wait_ms = PercentilesOf(admission_wait);
  std::sort(tpot.begin(), tpot.end());
  p.tpot_cdf_ms = Thinned(std::move(tpot));
  if (p.measured_s > 0) {
    p.tokens_per_s = static_cast<double>(p.tokens) / p.measured_s;
    p.queries_per_s = static_cast<double>(queries) / p.measured_s;
  }
  if (slo_tpot_ms.has_value()) {
    if (measured_sequences > 0) {
      p.goodput_sequences =
          static_cast<double>(good_sequences) / static_cast<double>(measured_sequences);
    }
    if (p.tokens > 0) {
      p.goodput_tokens = static_cast<double>(good_tokens) / static_cast<double>(p.tokens);
    }
    if (p.measured_s > 0) p.goodput_tokens_per_s = static_cast<double>(good_tokens) / p.measured_s;
    p.slo_met = !p.tpot_cdf_ms.empty() && p.tpot_ms.p99 <= *slo_tpot_ms;
  }
  return p;
}

nlohmann::json ToJson(const PointSummary& p) {
  return {{"value", OrNull(p.value)},
          {"measured_s", p.measured_s},
          {"warmup_s", p.warmup_s},
          {"sequences_arrived", p.arrived},
          {"sequences_finished", p.finished},
          {"sequences_unfinished", p.unfinished},
          {"tokens", p.tokens},
          {"tokens_per_s", p.tokens_per_s},
          {"queries_per_s", p.queries_per_s},
          {"calls", p.calls},
          {"errors", p.failed_calls},
          {"refused_admissions", p.refused_admissions},
          {"sequences_abandoned", p.abandoned},
          {"errors_by_code", p.errors},
          {"tpot_ms", ToJson(p.tpot_ms)},
          {"call_latency_us", ToJson(p.call_latency_us)},
          {"queue_us", ToJson(p.queue_us)},
          {"device_modeled_us", ToJson(p.device_modeled_us)},
          {"device_host_us", ToJson(p.device_host_us)},
          {"admission_wait_ms", ToJson(p.admission_wait_ms)},
          {"shares",
           {{"queue", p.share_queue}, {"device", p.share_device}, {"overhead", p.share_overhead}}},
          {"hybrid_fraction", p.hybrid_fraction},
          {"goodput",
           {{"sequences", p.goodput_sequences},
            {"tokens", p.goodput_tokens},
            {"tokens_per_s", p.goodput_tokens_per_s}}},
          {"slo_met", p.slo_met},
          {"tpot_cdf_ms", p.tpot_cdf_ms}};
}

void PrintPointReport(const ContinuousResult& r, const PointSummary& p, const std::string& target,
                      std::ostream& out) {
  const ContinuousOptions& o = r.options;
  out << absl::StrFormat("mlaserve continuous load against %s\n", target);
  std::vector<std::string> prompts;
  for (size_t i = 0; i < o.prompts.tokens.size(); ++i) {
    prompts.push_back(absl::StrFormat("%d tokens x%g", o.prompts.tokens[i], o.prompts.weights[i]));
  }
  out << absl::StrFormat(
      "  traffic    %s, %d layers, %d ranks x up to %d sequences, %s; system prompts %s; own "
      "prompt %s, steps %s; sq %d, %s-space q\n",
      r.model.name, r.layers, o.ranks, o.sequences,
      o.arrivals.open_loop() ? absl::StrFormat("arrivals %.3g/s (burstiness %g)", o.arrivals.rate(),
                                               o.arrivals.burstiness())
                             : std::string("closed population"),
      prompts.empty() ? "none" : absl::StrJoin(prompts, ", "), o.context.spec(), o.steps.spec(),
      o.sq, o.head_space ? "head" : "latent");
  out << absl::StrFormat(
      "  window     %.1f s after %.1f s of warm-up: %d sequences arrived, %d finished, %d still "
      "decoding at the end, %d abandoned after a failed call, %d admissions refused\n",
      p.measured_s, p.warmup_s, p.arrived, p.finished, p.unfinished, p.abandoned,
      p.refused_admissions);
  out << absl::StrFormat("  calls      %d, %d failed", p.calls, p.failed_calls);
  for (const auto& [code, n] : p.errors) out << absl::StrFormat("  [%s x%d]", code, n);
  out << "\n";
  out << absl::StrFormat("  throughput %.1f tokens/s (sequence steps), %.1f queries/s\n",
                         p.tokens_per_s, p.queries_per_s);
  out << absl::StrFormat("  %-24s %10s %10s %10s %10s\n", "", "p50", "p90", "p99", "max");
  auto row = [&out](const char* name, const Percentiles& q, const char* unit) {
    out << absl::StrFormat("  %-24s %10.2f %10.2f %10.2f %10.2f %s\n", name, q.p50, q.p90, q.p99,
                           q.max, unit);
  };
  row("time per output token", p.tpot_ms, "ms");
  row("call latency", p.call_latency_us, "us");
  row("queue wait", p.queue_us, "us");
  row("device time (host)", p.device_host_us, "us");
  row("device time (modelled)", p.device_modeled_us, "us");
  row("admission wait", p.admission_wait_ms, "ms");
  out << absl::StrFormat(
      "  shares     queue %.0f%%, device %.0f%%, overhead %.0f%% of the mean call; %.0f%% of "
      "queries ran hybrid (TyphoonMLA)\n",
      100 * p.share_queue, 100 * p.share_device, 100 * p.share_overhead, 100 * p.hybrid_fraction);
  if (p.slo_tpot_ms.has_value()) {
    out << absl::StrFormat(
        "  goodput    TPOT SLO %.3g ms: %.1f%% of sequences, %.1f%% of tokens (%.1f tokens/s); "
        "p99 %s\n",
        *p.slo_tpot_ms, 100 * p.goodput_sequences, 100 * p.goodput_tokens, p.goodput_tokens_per_s,
        p.slo_met ? "within the SLO" : "over the SLO");
  }
}

absl::StatusOr<SweepSpec> SweepSpec::Parse(absl::string_view spec) {
  auto bad = [&spec](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--sweep=", spec, ": ", why));
  };
  const std::pair<absl::string_view, absl::string_view> vv =
      absl::StrSplit(spec, absl::MaxSplits(':', 1));
  SweepSpec s;
  s.variable = std::string(vv.first);
  if (s.variable != "rate" && s.variable != "ranks" && s.variable != "sequences") {
    return bad("the variable must be rate, ranks or sequences, as rate:1,2,4");
  }
  if (vv.second.empty()) return bad("no values after ':'");
  for (absl::string_view text : absl::StrSplit(vv.second, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(text, &v) || !std::isfinite(v) || !(v > 0)) {
      return bad(absl::StrCat("'", text, "' is not a number above 0"));
    }
    if (s.variable != "rate" && (v != std::floor(v) || v > 1e6)) {
      return bad(absl::StrCat("'", text, "' is not a whole number"));
    }
    if (!s.values.empty() && v <= s.values.back()) {
      return bad("values must increase (the sweep stops once the SLO is lost for good)");
    }
    s.values.push_back(v);
  }
  return s;
}

std::string SweepSpec::unit() const {
  if (variable == "rate") return "sequences/s";
  if (variable == "ranks") return "ranks";
  return "sequences per rank";
}

ContinuousOptions SweepSpec::Apply(const ContinuousOptions& options, double value) const {
  ContinuousOptions o = options;
  if (variable == "rate") {
    o.arrivals = *ArrivalProcess::Create(value, options.arrivals.burstiness());
  } else if (variable == "ranks") {
    o.ranks = static_cast<int>(value);
  } else {
    o.sequences = static_cast<int>(value);
  }
  return o;
}

bool SloLostForGood(const std::vector<PointSummary>& points) {
  if (points.size() < 2) return false;
  for (size_t i = points.size() - 2; i < points.size(); ++i) {
    const PointSummary& p = points[i];
    if (!p.slo_tpot_ms.has_value() || p.finished == 0) return false;
    if (p.tpot_ms.p50 <= *p.slo_tpot_ms) return false;
  }
  return true;
}

std::optional<Knee> FindKnee(const std::vector<PointSummary>& points) {
  if (points.empty()) return std::nullopt;
  std::optional<Knee> knee;
  double best = -1;
  const bool slo = points.front().slo_tpot_ms.has_value();
  for (size_t i = 0; i < points.size(); ++i) {
    const PointSummary& p = points[i];
    if (slo) {
      if (p.slo_met && p.tokens_per_s > best) {
        best = p.tokens_per_s;
        knee = Knee{static_cast<int>(i), "highest throughput with p99 TPOT within the SLO"};
      }
    } else if (p.tpot_ms.p99 > 0 && p.tokens_per_s / p.tpot_ms.p99 > best) {
      best = p.tokens_per_s / p.tpot_ms.p99;
      knee = Knee{static_cast<int>(i), "highest throughput per ms of p99 TPOT"};
    }
  }
  return knee;
}

nlohmann::json SweepJson(const SweepContext& context, const SweepSpec* spec,
                         const std::vector<PointSummary>& points, bool stopped_early,
                         const std::string& stop_reason) {
  nlohmann::json j;
  j["schema"] = "mlaserve-loadgen-sweep/1";
  j["command"] = context.command;
  j["client"] = context.client;
  j["server"] = context.server;
  j["sweep"] = {{"variable", spec != nullptr ? spec->variable : ""},
                {"unit", spec != nullptr ? spec->unit() : ""},
                {"values", spec != nullptr ? spec->values : std::vector<double>{}}};
  j["slo_tpot_ms"] = points.empty() ? nlohmann::json(nullptr) : OrNull(points[0].slo_tpot_ms);
  const std::optional<Knee> knee = FindKnee(points);
  j["knee"] = knee.has_value() ? nlohmann::json{{"index", knee->index},
                                                {"value", OrNull(points[knee->index].value)},
                                                {"reason", knee->reason}}
                               : nlohmann::json(nullptr);
  j["stopped_early"] = stopped_early;
  j["stop_reason"] = stop_reason;
  j["points"] = nlohmann::json::array();
  for (const PointSummary& p : points) j["points"].push_back(ToJson(p));
  return j;
}

std::string SweepCsvHeader() {
  return "value,measured_s,sequences_arrived,sequences_finished,tokens,tokens_per_s,"
         "queries_per_s,calls,errors,tpot_mean_ms,tpot_p50_ms,tpot_p90_ms,tpot_p99_ms,"
         "call_p50_us,call_p99_us,queue_mean_us,device_modeled_mean_us,device_host_mean_us,"
         "admission_wait_p99_ms,share_queue,share_device,share_overhead,hybrid_fraction,"
         "slo_tpot_ms,goodput_sequences,goodput_tokens,goodput_tokens_per_s,slo_met,"
         "server_version,server_instance_id,server_model,server_layers,server_devices,"
         "server_device,server_cpu,server_matrix_unit,servers,client_cpu,client_isa,"
         "client_cores,client_hostname";
}

std::string SweepCsv(const SweepContext& context, const std::vector<PointSummary>& points) {
  const std::string context_columns = ContextColumns(context);
  std::string csv = SweepCsvHeader() + "\n";
  for (const PointSummary& p : points) {
    absl::StrAppend(
        &csv, p.value.has_value() ? absl::StrCat(*p.value) : "",
        absl::StrFormat(",%.3f,%d,%d,%d,%.3f,%.3f,%d,%d,%.4f,%.4f,%.4f,%.4f,%.2f,%.2f,%.2f,%.2f,"
                        "%.2f,%.4f,%.4f,%.4f,%.4f,%.4f,",
                        p.measured_s, p.arrived, p.finished, p.tokens, p.tokens_per_s,
                        p.queries_per_s, p.calls, p.failed_calls, p.tpot_ms.mean, p.tpot_ms.p50,
                        p.tpot_ms.p90, p.tpot_ms.p99, p.call_latency_us.p50, p.call_latency_us.p99,
                        p.queue_us.mean, p.device_modeled_us.mean, p.device_host_us.mean,
                        p.admission_wait_ms.p99, p.share_queue, p.share_device, p.share_overhead,
                        p.hybrid_fraction),
        p.slo_tpot_ms.has_value() ? absl::StrCat(*p.slo_tpot_ms) : "",
        absl::StrFormat(",%.4f,%.4f,%.3f,%d,", p.goodput_sequences, p.goodput_tokens,
                        p.goodput_tokens_per_s, p.slo_met ? 1 : 0),
        context_columns, "\n");
  }
  return csv;
}

std::string SweepTableHeader(const SweepSpec* spec) {
  return absl::StrFormat("  %-12s %10s %10s %10s %10s %9s %8s %7s %s",
                         spec != nullptr ? spec->variable : "run", "tokens/s", "TPOT p50",
                         "TPOT p99", "call p99", "finished", "hybrid", "errors", "goodput");
}

std::string SweepTableRow(const PointSummary& p) {
  return absl::StrFormat(
      "  %-12s %10.1f %8.2fms %8.2fms %8.0fus %9d %7.0f%% %7d %s",
      p.value.has_value() ? absl::StrCat(*p.value) : "-", p.tokens_per_s, p.tpot_ms.p50,
      p.tpot_ms.p99, p.call_latency_us.p99, p.finished, 100 * p.hybrid_fraction, p.failed_calls,
      p.slo_tpot_ms.has_value()
          ? absl::StrFormat("%.0f%% seq, %.0f%% tok%s", 100 * p.goodput_sequences,
                            100 * p.goodput_tokens, p.slo_met ? "" : " (p99 over SLO)")
          : std::string("-"));
}

}  // namespace mlaserve::loadgen
