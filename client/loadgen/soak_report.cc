#include "client/loadgen/soak_report.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace mlaserve::loadgen {
namespace {

nlohmann::json Json(const Drift& d) {
  return {{"first", d.first}, {"last", d.last}, {"drift", d.drift}};
}

// JSON has no infinity; an answer that failed on shape or a non-finite value reports null.
nlohmann::json Finite(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

std::string Percent(double fraction) { return absl::StrFormat("%+.2f %%", fraction * 100); }

}  // namespace

nlohmann::json SoakToJson(const SoakResult& r) {
  const SoakOptions& o = r.options;
  nlohmann::json j;
  j["passed"] = r.failures.empty();
  j["failures"] = r.failures;
  j["workload"] = {{"model", r.model},
                   {"layers", r.layers},
                   {"heads", r.heads},
                   {"workers", o.workers},
                   {"sequences", o.sequences},
                   {"prefix_tokens", o.prefix_tokens},
                   {"prompt_tokens", {o.min_prompt, o.max_prompt}},
                   {"life_steps", {o.min_life, o.max_life}},
                   {"prefix_fraction", o.prefix_fraction},
                   {"fork_fraction", o.fork_fraction},
                   {"sq", o.sq},
                   {"kv_dtype", "bf16"},
                   {"check_every", o.check_every},
                   {"duration_s", absl::ToDoubleSeconds(o.duration)},
                   {"warmup_s", o.warmup_s},
                   {"sample_s", o.sample_s}};
  j["wall_s"] = r.wall_s;
  j["calls"] = r.calls;
  j["calls_by_rpc"] = r.calls_by_rpc;
  j["calls_per_s"] = r.wall_s > 0 ? static_cast<double>(r.calls) / r.wall_s : 0.0;
  j["decode_queries"] = r.decode_queries;
  j["churn"] = {{"created", r.churn.created},
                {"forked", r.churn.forked},
                {"released", r.churn.released},
                {"decode_steps", r.churn.decode_steps}};
  j["answers"] = {{"checked", r.checked_answers},
                  {"wrong", r.wrong_answers},
                  {"skipped", r.skipped_checks},
                  {"worst_bound_ratio", Finite(r.worst.worst_bound_ratio)},
                  {"max_abs_out_error", Finite(r.worst.max_abs_out)},
                  {"max_abs_lse_error", Finite(r.worst.max_abs_lse)},
                  {"max_cos_diff", Finite(r.worst.cos_diff)},
                  {"first_wrong", r.first_wrong}};
  j["errors"] = r.errors;
  j["first_error"] = r.first_error;
  nlohmann::json samples = nlohmann::json::array();
  for (const ResourceSample& s : r.samples) {
    nlohmann::json sample = {{"t_s", s.t_s},
                             {"rss_bytes", s.rss_bytes},
                             {"threads", s.threads},
                             {"open_fds", s.open_fds},
                             {"kv_resident_bytes", s.kv_resident_bytes}};
    if (s.heap_in_use_bytes.has_value()) sample["heap_in_use_bytes"] = *s.heap_in_use_bytes;
    samples.push_back(std::move(sample));
  }
  j["server"] = {{"samples", samples}, {"scrape_failures", r.scrape_failures}};
  if (r.drift.has_value()) {
    j["server"]["drift"] = {{"samples_after_warmup", r.drift->samples},
                            {"window", r.drift->window},
                            {"rss_bytes", Json(r.drift->rss)},
                            {"threads", Json(r.drift->threads)},
                            {"open_fds", Json(r.drift->open_fds)},
                            {"kv_resident_bytes", Json(r.drift->kv_resident)},
                            {"rss_outside_kv_bytes", Json(r.drift->rss_outside_kv)},
                            {"max_rss_drift", o.max_rss_drift}};
    if (r.drift->heap_in_use.has_value()) {
      j["server"]["drift"]["heap_in_use_bytes"] = Json(*r.drift->heap_in_use);
    }
  } else {
    j["server"]["drift_error"] = r.drift_error;
  }
  return j;
}

void PrintSoakReport(const SoakResult& r, const std::string& target, std::ostream& out) {
  const SoakOptions& o = r.options;
  out << absl::StrFormat("mlaserve soak against %s (metrics %s)\n", target, o.metrics_target);
  out << absl::StrFormat(
      "  workload   %s, %d layer(s), %d workers x %d live sequences, prefix %d tokens (%.0f %% of "
      "creations), own prompt %d-%d, life %d-%d steps, forks %.0f %% of replacements, sq %d, "
      "latent q, bf16 cache\n",
      r.model, r.layers, o.workers, o.sequences, o.prefix_tokens, o.prefix_fraction * 100,
      o.min_prompt, o.max_prompt, o.min_life, o.max_life, o.fork_fraction * 100, o.sq);
  std::vector<std::string> by_rpc;
  for (const auto& [rpc, n] : r.calls_by_rpc) by_rpc.push_back(absl::StrFormat("%s %d", rpc, n));
  out << absl::StrFormat("  duration   %.1f s (warm-up %.0f s)\n", r.wall_s, o.warmup_s);
  out << absl::StrFormat("  calls      %d, %.1f/s (%s); %d decode queries\n", r.calls,
                         r.wall_s > 0 ? static_cast<double>(r.calls) / r.wall_s : 0.0,
                         absl::StrJoin(by_rpc, ", "), r.decode_queries);
  out << absl::StrFormat("  churn      %d created, %d forked, %d released, %d decode steps\n",
                         r.churn.created, r.churn.forked, r.churn.released, r.churn.decode_steps);
  out << absl::StrFormat(
      "  answers    %d checked against the fp64 golden (every %d-th decode call), %d wrong, %d "
      "skipped; worst error %.3g of its bound (|out err| %.3g, |lse err| %.3g, cos_diff %.3g)\n",
      r.checked_answers, o.check_every, r.wrong_answers, r.skipped_checks,
      r.worst.worst_bound_ratio, r.worst.max_abs_out, r.worst.max_abs_lse, r.worst.cos_diff);
  if (!r.first_wrong.empty()) out << "  first wrong answer: " << r.first_wrong << "\n";
  if (r.errors.empty()) {
    out << "  errors     none\n";
  } else {
    std::vector<std::string> codes;
    for (const auto& [code, n] : r.errors) codes.push_back(absl::StrFormat("%s %d", code, n));
    out << "  errors     " << absl::StrJoin(codes, ", ")
        << " (all unexpected; first: " << r.first_error << ")\n";
  }
  if (r.drift.has_value()) {
    const ResourceDrift& d = *r.drift;
    out << absl::StrFormat(
        "  server     rss %.1f -> %.1f MiB (%s), threads %.1f -> %.1f (%s), open fds %.1f -> "
        "%.1f (%s)\n"
        "             means of the first and last %d of %d samples after warm-up, every %.0f s\n",
        d.rss.first / (1 << 20), d.rss.last / (1 << 20), Percent(d.rss.drift), d.threads.first,
        d.threads.last, Percent(d.threads.drift), d.open_fds.first, d.open_fds.last,
        Percent(d.open_fds.drift), d.window, d.samples, o.sample_s);
    out << absl::StrFormat(
        "             of the RSS, KV pool pages resident %.1f -> %.1f MiB; outside the pool "
        "%.1f -> %.1f MiB (%s of the RSS)\n",
        d.kv_resident.first / (1 << 20), d.kv_resident.last / (1 << 20),
        d.rss_outside_kv.first / (1 << 20), d.rss_outside_kv.last / (1 << 20),
        Percent(d.rss_outside_kv.drift));
    if (d.heap_in_use.has_value()) {
      out << absl::StrFormat("             allocator in use %.1f -> %.1f MiB (%s)\n",
                             d.heap_in_use->first / (1 << 20), d.heap_in_use->last / (1 << 20),
                             Percent(d.heap_in_use->drift));
    }
  } else {
    out << "  server     no drift: " << r.drift_error << "\n";
  }
  if (r.scrape_failures > 0) {
    out << absl::StrFormat("  scrapes    %d failed (first: %s)\n", r.scrape_failures,
                           r.first_scrape_error);
  }
  if (r.failures.empty()) {
    out << absl::StrFormat("  verdict    PASS (RSS drift outside the KV pool within %s)\n",
                           Percent(o.max_rss_drift));
  } else {
    out << "  verdict    FAIL: " << absl::StrJoin(r.failures, "; ") << "\n";
  }
}

}  // namespace mlaserve::loadgen
