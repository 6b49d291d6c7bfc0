#ifndef MLASERVE_SERVER_DATAPLANE_DATA_PLANE_STATS_COLLECTOR_H_
#define MLASERVE_SERVER_DATAPLANE_DATA_PLANE_STATS_COLLECTOR_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/dataplane/shm_data_plane.h"
#include "server/dataplane/ucx_data_plane.h"

namespace mlaserve::dataplane {

// The data planes as Prometheus metrics, read when scraped, each by `plane` ("shm", "ucx"):
// mlaserve_data_plane_clients (registered now), mlaserve_data_plane_registered_bytes (shm:
// their regions; ucx: the bytes of their calls in flight),
// mlaserve_data_plane_registered_bytes_limit (--data_plane_memory_mb,
// --data_plane_ucx_memory_mb), mlaserve_data_plane_calls_in_flight (taken, not yet
// answered) and mlaserve_data_plane_refused_doorbells_total (shm: doorbells for a slot
// already running a call). Their calls are mlaserve_requests_total{transport="shm"|"ucx"}.
// Either plane may be null (off); they must outlive the exposer.
class DataPlaneStatsCollector : public prometheus::Collectable {
 public:
  DataPlaneStatsCollector(const ShmDataPlane* shm, const UcxDataPlane* ucx)
      : shm_(shm), ucx_(ucx) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const ShmDataPlane* shm_;
  const UcxDataPlane* ucx_;
};

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_DATA_PLANE_STATS_COLLECTOR_H_
