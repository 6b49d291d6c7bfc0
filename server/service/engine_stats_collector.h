#ifndef MLASERVE_SERVER_SERVICE_ENGINE_STATS_COLLECTOR_H_
#define MLASERVE_SERVER_SERVICE_ENGINE_STATS_COLLECTOR_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/engine/engine.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

// Prometheus gauges read from Engine::Stats() when scraped (KV pages and bytes, prefixes,
// sequences, evictions, queued queries), so they are exact at scrape time and cost nothing
// between scrapes. The engine must outlive the exposer this is registered with.
class EngineStatsCollector : public prometheus::Collectable {
 public:
  // With `tenancy` (not single-tenant), also each tenant's queue, KV use and quota, and
  // counts of what it was refused.
  explicit EngineStatsCollector(const engine::Engine& engine, const Tenancy* tenancy = nullptr)
      : engine_(engine), tenancy_(tenancy) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const engine::Engine& engine_;
  const Tenancy* tenancy_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_ENGINE_STATS_COLLECTOR_H_
