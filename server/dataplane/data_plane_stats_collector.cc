#include "server/dataplane/data_plane_stats_collector.h"

#include "server/service/metric_family.h"

namespace mlaserve::dataplane {

std::vector<prometheus::MetricFamily> DataPlaneStatsCollector::Collect() const {
  using prometheus::MetricType;
  using service::Family;
  using service::Sample;
  const auto shm = [](double v) { return std::vector<Sample>{{"shm", v}}; };
  return {
      Family("mlaserve_data_plane_clients", "Clients registered with a data plane now",
             MetricType::Gauge, "plane", shm(plane_.clients())),
      Family("mlaserve_data_plane_registered_bytes",
             "Memory clients have registered with a data plane", MetricType::Gauge, "plane",
             shm(static_cast<double>(plane_.registered_bytes()))),
      Family("mlaserve_data_plane_registered_bytes_limit",
             "The most memory all clients may register with a data plane (--data_plane_memory_mb)",
             MetricType::Gauge, "plane", shm(static_cast<double>(plane_.registered_bytes_limit()))),
      Family("mlaserve_data_plane_refused_doorbells_total",
             "Doorbells refused: their slot was still running a call", MetricType::Counter, "plane",
             shm(static_cast<double>(plane_.refused_doorbells()))),
  };
}

}  // namespace mlaserve::dataplane
