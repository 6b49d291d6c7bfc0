#include "server/service/guard_stats_collector.h"

#include "server/service/metric_family.h"

namespace mlaserve::service {

std::vector<prometheus::MetricFamily> GuardStatsCollector::Collect() const {
  using prometheus::MetricType;
  const listener::GuardedListener::Stats stats = listener_.stats();
  const auto value = [](int64_t v) { return std::vector<Sample>{{"", static_cast<double>(v)}}; };
  return {
      Family("mlaserve_http2_guard_connections", "Connections the HTTP/2 guard relays now",
             MetricType::Gauge, "", value(stats.connections_open)),
      Family("mlaserve_http2_guard_connections_total", "Connections the HTTP/2 guard accepted",
             MetricType::Counter, "", value(stats.connections_accepted)),
      Family("mlaserve_http2_guard_goaways_total",
             "Connections the HTTP/2 guard ended with GOAWAY, by reason", MetricType::Counter,
             "reason",
             {{"resets", static_cast<double>(stats.closed_for_resets)},
              {"streams", static_cast<double>(stats.closed_for_streams)},
              {"protocol", static_cast<double>(stats.closed_for_protocol)}}),
      Family("mlaserve_http2_guard_refused_connections_total",
             "Connections closed at accept: their client was ended for resets or streams within "
             "the cooldown",
             MetricType::Counter, "", value(stats.refused_connections)),
      Family("mlaserve_http2_guard_refused_messages_total",
             "Request messages refused RESOURCE_EXHAUSTED by their declared length",
             MetricType::Counter, "", value(stats.refused_messages)),
      Family("mlaserve_http2_guard_streams_total",
             "Streams clients opened, counted as their bytes are read", MetricType::Counter, "",
             value(stats.streams)),
      Family("mlaserve_http2_guard_resets_total",
             "RST_STREAM frames clients sent, counted as their bytes are read", MetricType::Counter,
             "", value(stats.resets)),
  };
}

}  // namespace mlaserve::service
