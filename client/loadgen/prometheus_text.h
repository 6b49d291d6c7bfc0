#ifndef MLASERVE_CLIENT_LOADGEN_PROMETHEUS_TEXT_H_
#define MLASERVE_CLIENT_LOADGEN_PROMETHEUS_TEXT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlaserve::loadgen {

// One sample line of Prometheus' text exposition format: `name{labels} value [timestamp]`.
struct PrometheusSample {
  std::string name;
  std::string labels;  // between the braces, as written; empty for an unlabelled sample
  double value = 0;
};

// The samples of a /metrics body (format 0.0.4). Comment lines (# HELP, # TYPE) and blank
// lines are skipped; values may be NaN, +Inf or -Inf. INVALID_ARGUMENT naming the line if a
// sample line is malformed, so a scrape of the wrong endpoint is not read as empty.
absl::StatusOr<std::vector<PrometheusSample>> ParsePrometheusText(absl::string_view body);

// The value of the sample `name` whose labels are written exactly as `labels` (empty: the
// unlabelled sample), if present.
std::optional<double> FindSample(const std::vector<PrometheusSample>& samples,
                                 absl::string_view name, absl::string_view labels = "");

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_PROMETHEUS_TEXT_H_
