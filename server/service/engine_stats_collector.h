#ifndef MLASERVE_SERVER_SERVICE_ENGINE_STATS_COLLECTOR_H_
#define MLASERVE_SERVER_SERVICE_ENGINE_STATS_COLLECTOR_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/engine/engine.h"

namespace mlaserve::service {

// Prometheus gauges read from Engine::Stats() when scraped (KV pages and bytes, prefixes,
// sequences, evictions, queued queries), so they are exact at scrape time and cost nothing
// between scrapes. The engine must outlive the exposer this is registered with.
class EngineStatsCollector : public prometheus::Collectable {
 public:
  explicit EngineStatsCollector(const engine::Engine& engine) : engine_(engine) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const engine::Engine& engine_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_ENGINE_STATS_COLLECTOR_H_
