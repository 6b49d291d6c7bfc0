#ifndef MLASERVE_CLIENT_LOADGEN_LOAD_REPORT_H_
#define MLASERVE_CLIENT_LOADGEN_LOAD_REPORT_H_

#include <map>
#include <ostream>
#include <string>

#include "client/loadgen/workload.h"
#include "nlohmann/json.hpp"

namespace mlaserve::loadgen {

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
};

// Nearest-rank percentiles of `values` (all zero when empty); every report of this project
// that states a percentile computes it here.
Percentiles PercentilesOf(std::vector<double> values);
nlohmann::json ToJson(const Percentiles& p);

// A run boiled down to what a serving engineer asks: throughput, latency, where the time
// went (queueing, device, the RPC itself), and how the server planned.
struct LoadSummary {
  int64_t warmup_calls = 0;  // each worker's first step, left out of everything below
  int64_t calls = 0;
  int64_t failed_calls = 0;
  std::map<std::string, int64_t> errors;  // status code name -> calls
  double wall_s = 0;                      // the measured part of the run
  double calls_per_s = 0;
  double queries_per_s = 0;
  double tokens_per_s = 0;  // sequence-steps (all layers answered) per second
  Percentiles latency_ms;   // client-observed, per call
  Percentiles queue_us;     // waiting to be batched
  Percentiles device_host_ms;
  Percentiles overhead_us;  // latency - queue - device host: the RPC, codec and planning
  double mean_batch_size = 0;
  double mean_device_modeled_us = 0;  // per device batch
  double hybrid_fraction = 0;         // of answered queries
};

LoadSummary Summarize(const LoadResult& result);
nlohmann::json ToJson(const LoadResult& result, const LoadSummary& summary);
void PrintReport(const LoadResult& result, const LoadSummary& summary, const std::string& target,
                 std::ostream& out);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_LOAD_REPORT_H_
