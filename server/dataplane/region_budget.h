#ifndef MLASERVE_SERVER_DATAPLANE_REGION_BUDGET_H_
#define MLASERVE_SERVER_DATAPLANE_REGION_BUDGET_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/service/tenancy.h"

namespace mlaserve::dataplane {

// Caps on the memory clients register with a data plane, as --grpc_memory bounds what gRPC
// holds: a region's own size, each tenant's total and the server's total. Thread-safe.
class RegionBudget {
 public:
  struct Caps {
    uint64_t region_bytes = uint64_t{1} << 30;  // --data_plane_region_mb
    uint64_t tenant_bytes = uint64_t{4} << 30;  // --data_plane_tenant_mb
    uint64_t total_bytes = uint64_t{16} << 30;  // --data_plane_memory_mb
  };
  explicit RegionBudget(Caps caps) : caps_(caps) {}

  const Caps& caps() const { return caps_; }
  // Room for a region of `bytes` for `tenant` (nullptr: single-tenant), or RESOURCE_EXHAUSTED
  // naming the cap it would pass and its flag. Nothing is taken on a refusal.
  absl::Status Take(service::Tenant* tenant, uint64_t bytes);
  void Give(service::Tenant* tenant, uint64_t bytes);
  uint64_t total() const;

 private:
  const Caps caps_;
  mutable absl::Mutex mu_;
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<service::Tenant*, uint64_t> by_tenant_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_REGION_BUDGET_H_
