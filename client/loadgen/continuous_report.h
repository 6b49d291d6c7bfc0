#ifndef MLASERVE_CLIENT_LOADGEN_CONTINUOUS_REPORT_H_
#define MLASERVE_CLIENT_LOADGEN_CONTINUOUS_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/loadgen/continuous.h"
#include "client/loadgen/load_report.h"
#include "nlohmann/json.hpp"

namespace mlaserve::loadgen {

// A continuous run (one point of a sweep) in a serving engineer's terms. Everything counts
// what happened in the measured window only (after the warm-up).
struct PointSummary {
  std::optional<double> value;  // the swept variable's value at this point
  double measured_s = 0;
  double warmup_s = 0;
  int64_t arrived = 0;             // sequences that arrived in the window
  int64_t finished = 0;            // sequences that took their last step in the window
  int64_t unfinished = 0;          // admitted, still decoding at the window's end
  int64_t abandoned = 0;           // retired unfinished after a failed call
  int64_t refused_admissions = 0;  // in the window, by code in `errors` too
  int64_t tokens = 0;              // sequence-steps (every layer answered) ending in the window
  int64_t calls = 0;
  int64_t failed_calls = 0;
  std::map<std::string, int64_t> errors;  // code -> failed calls and refused admissions
  double tokens_per_s = 0;
  double queries_per_s = 0;
  // Time per output token: per sequence that finished in the window or was still decoding
  // at its end, the mean of its steps' times so far (a step is every layer's call, one after
  // another, as a framework's forward pass waits for each). Counting the unfinished keeps a
  // window shorter than the sequences' lives from measuring only the short ones.
  Percentiles tpot_ms;
  Percentiles call_latency_us;
  Percentiles queue_us;  // waiting to be batched, per call
  Percentiles device_modeled_us;
  Percentiles device_host_us;
  Percentiles admission_wait_ms;  // arrival to admission (waiting for a rank with room)
  // Of the mean call latency: batching queue, device (host time), the rest (RPC, codec,
  // planning). They add up to 1.
  double share_queue = 0, share_device = 0, share_overhead = 0;
  double hybrid_fraction = 0;  // of answered queries
  std::optional<double> slo_tpot_ms;
  // With an SLO: the share of those sequences whose TPOT is within it, the share of tokens
  // whose step was, and those tokens per second.
  double goodput_sequences = 0, goodput_tokens = 0, goodput_tokens_per_s = 0;
  bool slo_met = false;             // p99 TPOT within the SLO (false without an SLO)
  std::vector<double> tpot_cdf_ms;  // the sorted TPOTs above, thinned to at most 200
};

PointSummary SummarizePoint(const ContinuousResult& result, std::optional<double> value,
                            std::optional<double> slo_tpot_ms);
nlohmann::json ToJson(const PointSummary& point);
void PrintPointReport(const ContinuousResult& result, const PointSummary& point,
                      const std::string& target, std::ostream& out);

// `--sweep=VARIABLE:V1,V2,...`: rate (arrivals per second), ranks, or sequences (per rank).
struct SweepSpec {
  std::string variable;
  std::vector<double> values;

  // INVALID_ARGUMENT naming --sweep: unknown variable, no value, a value that is not a number
  // (a whole number of at least 1 for ranks and sequences; above 0 for rate), or values that
  // do not increase (the early stop assumes load grows along the sweep).
  static absl::StatusOr<SweepSpec> Parse(absl::string_view spec);
  std::string unit() const;
  // `options` with this sweep's variable set to `value`.
  ContinuousOptions Apply(const ContinuousOptions& options, double value) const;
};

// Whether a sweep should stop after `points`: the last two both have a p50 TPOT over the SLO,
// so even the typical sequence misses it and more load cannot bring it back.
bool SloLostForGood(const std::vector<PointSummary>& points);

// The knee: with an SLO, the point of highest throughput whose p99 TPOT is within it;
// without, the point of highest throughput per p99 TPOT (throughput bought before latency
// climbs). The reason says which. Nothing for no points.
struct Knee {
  int index = 0;
  std::string reason;
};
std::optional<Knee> FindKnee(const std::vector<PointSummary>& points);

// The sweep's files (docs/loadgen.md, "Sweeps"): one JSON object with the run's context
// (command, client machine, server) and every point, and a CSV with one row per point.
struct SweepContext {
  std::string command;
  nlohmann::json client;  // cpu, isa, cores, hostname
  nlohmann::json server;  // from GetServerInfo
};
nlohmann::json SweepJson(const SweepContext& context, const SweepSpec* spec,
                         const std::vector<PointSummary>& points, bool stopped_early,
                         const std::string& stop_reason);
// Every row ends with the run's context, the same on each row (the server's version, instance,
// model, layers, devices, device profile, CPU and matrix unit from GetServerInfo; the client's
// CPU, ISA, cores and hostname), so a row read on its own, or rows of several runs put in one
// table, still say what produced them. Fields holding a comma or a quote are quoted (RFC 4180).
std::string SweepCsv(const SweepContext& context, const std::vector<PointSummary>& points);
// The CSV's header, one documented column per field.
std::string SweepCsvHeader();
// One line per point for the terminal, and its header.
std::string SweepTableHeader(const SweepSpec* spec);
std::string SweepTableRow(const PointSummary& point);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_CONTINUOUS_REPORT_H_
