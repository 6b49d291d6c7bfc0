#include "server/dataplane/data_plane_stats_collector.h"

#include "server/service/metric_family.h"

namespace mlaserve::dataplane {

std::vector<prometheus::MetricFamily> DataPlaneStatsCollector::Collect() const {
  using prometheus::MetricType;
  using service::Family;
  using service::Sample;
  // One sample per plane that is on, for a family.
  const auto per_plane = [this](auto shm, auto ucx) {
    std::vector<Sample> samples;
    if (shm_ != nullptr) samples.push_back({"shm", static_cast<double>(shm(*shm_))});
    if (ucx_ != nullptr) samples.push_back({"ucx", static_cast<double>(ucx(*ucx_))});
    return samples;
  };
  std::vector<prometheus::MetricFamily> families = {
      Family("mlaserve_data_plane_clients", "Clients registered with a data plane now",
             MetricType::Gauge, "plane",
             per_plane([](const ShmDataPlane& p) { return p.clients(); },
                       [](const UcxDataPlane& p) { return p.clients(); })),
      Family("mlaserve_data_plane_registered_bytes",
             "Memory clients hold in a data plane (shm: registered regions; ucx: calls in flight)",
             MetricType::Gauge, "plane",
             per_plane([](const ShmDataPlane& p) { return p.registered_bytes(); },
                       [](const UcxDataPlane& p) { return p.in_flight_bytes(); })),
      Family("mlaserve_data_plane_registered_bytes_limit",
             "The most memory all clients may hold in a data plane (--data_plane_memory_mb, "
             "--data_plane_ucx_memory_mb)",
             MetricType::Gauge, "plane",
             per_plane([](const ShmDataPlane& p) { return p.registered_bytes_limit(); },
                       [](const UcxDataPlane& p) { return p.in_flight_bytes_limit(); })),
      Family("mlaserve_data_plane_calls_in_flight", "Data-plane calls taken and not yet answered",
             MetricType::Gauge, "plane",
             per_plane([](const ShmDataPlane& p) { return p.calls_in_flight(); },
                       [](const UcxDataPlane& p) { return p.calls_in_flight(); })),
  };
  if (shm_ != nullptr) {
    families.push_back(Family("mlaserve_data_plane_refused_doorbells_total",
                              "Doorbells refused: their slot was still running a call",
                              MetricType::Counter, "plane",
                              {{"shm", static_cast<double>(shm_->refused_doorbells())}}));
  }
  return families;
}

}  // namespace mlaserve::dataplane
