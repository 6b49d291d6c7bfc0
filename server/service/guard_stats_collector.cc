#include "server/service/guard_stats_collector.h"

#include <string>
#include <utility>

namespace mlaserve::service {
namespace {

using prometheus::MetricType;

struct Sample {
  const char* reason;  // the `reason` label's value; null: unlabelled
  int64_t value;
};

void AddFamily(std::vector<prometheus::MetricFamily>& families, std::string name, std::string help,
               MetricType type, std::vector<Sample> samples) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  for (const Sample& sample : samples) {
    prometheus::ClientMetric metric;
    if (sample.reason != nullptr) metric.label.push_back({"reason", sample.reason});
    (type == MetricType::Counter ? metric.counter.value : metric.gauge.value) =
        static_cast<double>(sample.value);
    family.metric.push_back(std::move(metric));
  }
  families.push_back(std::move(family));
}

}  // namespace

std::vector<prometheus::MetricFamily> GuardStatsCollector::Collect() const {
  const listener::GuardedListener::Stats stats = listener_.stats();
  std::vector<prometheus::MetricFamily> families;
  AddFamily(families, "mlaserve_http2_guard_connections", "Connections the HTTP/2 guard relays now",
            MetricType::Gauge, {{nullptr, stats.connections_open}});
  AddFamily(families, "mlaserve_http2_guard_connections_total",
            "Connections the HTTP/2 guard accepted", MetricType::Counter,
            {{nullptr, stats.connections_accepted}});
  AddFamily(families, "mlaserve_http2_guard_goaways_total",
            "Connections the HTTP/2 guard ended with GOAWAY, by reason", MetricType::Counter,
            {{"resets", stats.closed_for_resets},
             {"streams", stats.closed_for_streams},
             {"protocol", stats.closed_for_protocol}});
  AddFamily(families, "mlaserve_http2_guard_refused_connections_total",
            "Connections closed at accept: their client was ended for resets or streams within "
            "the cooldown",
            MetricType::Counter, {{nullptr, stats.refused_connections}});
  AddFamily(families, "mlaserve_http2_guard_refused_messages_total",
            "Request messages refused RESOURCE_EXHAUSTED by their declared length",
            MetricType::Counter, {{nullptr, stats.refused_messages}});
  AddFamily(families, "mlaserve_http2_guard_streams_total",
            "Streams clients opened, counted as their connections end", MetricType::Counter,
            {{nullptr, stats.streams}});
  AddFamily(families, "mlaserve_http2_guard_resets_total",
            "RST_STREAM frames clients sent, counted as their connections end", MetricType::Counter,
            {{nullptr, stats.resets}});
  return families;
}

}  // namespace mlaserve::service
