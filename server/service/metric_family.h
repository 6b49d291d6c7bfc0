#ifndef MLASERVE_SERVER_SERVICE_METRIC_FAMILY_H_
#define MLASERVE_SERVER_SERVICE_METRIC_FAMILY_H_

#include <string>
#include <utility>
#include <vector>

#include "prometheus/metric_family.h"

namespace mlaserve::service {

// One sample of a family built at scrape time: its label's value (empty: unlabelled) and value.
struct Sample {
  std::string label_value;
  double value = 0;
};

// A counter or gauge family whose samples differ by one label (`label_name`), for the
// collectors that read their values when scraped.
inline prometheus::MetricFamily Family(std::string name, std::string help,
                                       prometheus::MetricType type, const std::string& label_name,
                                       std::vector<Sample> samples) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  for (const Sample& sample : samples) {
    prometheus::ClientMetric metric;
    if (!sample.label_value.empty()) metric.label.push_back({label_name, sample.label_value});
    if (type == prometheus::MetricType::Counter) {
      metric.counter.value = sample.value;
    } else {
      metric.gauge.value = sample.value;
    }
    family.metric.push_back(std::move(metric));
  }
  return family;
}

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_METRIC_FAMILY_H_
