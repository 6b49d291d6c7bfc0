#ifndef MLASERVE_SERVER_DATAPLANE_DATA_PLANE_STATS_COLLECTOR_H_
#define MLASERVE_SERVER_DATAPLANE_DATA_PLANE_STATS_COLLECTOR_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/dataplane/shm_data_plane.h"

namespace mlaserve::dataplane {

// The same-host data plane as Prometheus metrics, read when scraped, each by `plane`:
// mlaserve_data_plane_clients (registered now), mlaserve_data_plane_registered_bytes (their
// regions), mlaserve_data_plane_registered_bytes_limit (--data_plane_memory_mb) and
// mlaserve_data_plane_refused_doorbells_total (doorbells for a slot already running a call).
// Its calls are mlaserve_requests_total{transport="shm"}. The plane must outlive the exposer.
class DataPlaneStatsCollector : public prometheus::Collectable {
 public:
  explicit DataPlaneStatsCollector(const ShmDataPlane& plane) : plane_(plane) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const ShmDataPlane& plane_;
};

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_DATA_PLANE_STATS_COLLECTOR_H_
