#include "server/service/guard_stats_collector.h"

#include <string>
#include <utility>

namespace mlaserve::service {
namespace {

using prometheus::MetricType;

prometheus::MetricFamily Family(std::string name, std::string help, MetricType type) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

void Add(prometheus::MetricFamily& family, double value, const char* reason = nullptr) {
  prometheus::ClientMetric metric;
  if (reason != nullptr) metric.label.push_back({"reason", reason});
  if (family.type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

}  // namespace

std::vector<prometheus::MetricFamily> GuardStatsCollector::Collect() const {
  const listener::GuardedListener::Stats stats = listener_.stats();
  std::vector<prometheus::MetricFamily> families;
  auto open = Family("mlaserve_http2_guard_connections", "Connections the HTTP/2 guard relays now",
                     MetricType::Gauge);
  Add(open, static_cast<double>(stats.connections_open));
  families.push_back(std::move(open));
  auto accepted = Family("mlaserve_http2_guard_connections_total",
                         "Connections the HTTP/2 guard accepted", MetricType::Counter);
  Add(accepted, static_cast<double>(stats.connections_accepted));
  families.push_back(std::move(accepted));
  auto goaways =
      Family("mlaserve_http2_guard_goaways_total",
             "Connections the HTTP/2 guard ended with GOAWAY, by reason", MetricType::Counter);
  Add(goaways, static_cast<double>(stats.closed_for_resets), "resets");
  Add(goaways, static_cast<double>(stats.closed_for_streams), "streams");
  Add(goaways, static_cast<double>(stats.closed_for_protocol), "protocol");
  families.push_back(std::move(goaways));
  auto cooled = Family("mlaserve_http2_guard_refused_connections_total",
                       "Connections closed at accept: their client was ended for resets or "
                       "streams within the last second",
                       MetricType::Counter);
  Add(cooled, static_cast<double>(stats.refused_connections));
  families.push_back(std::move(cooled));
  auto refused = Family("mlaserve_http2_guard_refused_messages_total",
                        "Request messages refused RESOURCE_EXHAUSTED by their declared length",
                        MetricType::Counter);
  Add(refused, static_cast<double>(stats.refused_messages));
  families.push_back(std::move(refused));
  auto streams =
      Family("mlaserve_http2_guard_streams_total",
             "Streams clients opened, counted as their connections end", MetricType::Counter);
  Add(streams, static_cast<double>(stats.streams));
  families.push_back(std::move(streams));
  auto resets = Family("mlaserve_http2_guard_resets_total",
                       "RST_STREAM frames clients sent, counted as their connections end",
                       MetricType::Counter);
  Add(resets, static_cast<double>(stats.resets));
  families.push_back(std::move(resets));
  return families;
}

}  // namespace mlaserve::service
