#ifndef MLASERVE_SERVER_SERVICE_GUARD_STATS_COLLECTOR_H_
#define MLASERVE_SERVER_SERVICE_GUARD_STATS_COLLECTOR_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/listener/guarded_listener.h"

namespace mlaserve::service {

// The HTTP/2 guard's counts (GuardedListener::Stats) as Prometheus metrics, read when scraped:
// mlaserve_http2_guard_connections (open), _connections_total (accepted),
// _goaways_total{reason}, _refused_connections_total, _refused_messages_total, _streams_total and
// _resets_total (the last two counted as connections end). The listener must outlive the exposer.
class GuardStatsCollector : public prometheus::Collectable {
 public:
  explicit GuardStatsCollector(const listener::GuardedListener& listener) : listener_(listener) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const listener::GuardedListener& listener_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_GUARD_STATS_COLLECTOR_H_
