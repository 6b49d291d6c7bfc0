#ifndef MLASERVE_SERVER_DATAPLANE_UCX_CALL_BUDGET_H_
#define MLASERVE_SERVER_DATAPLANE_UCX_CALL_BUDGET_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/service/tenancy.h"

namespace mlaserve::dataplane {

// Caps on the bytes of calls the UCX plane holds (received and not yet answered), as
// --grpc_memory bounds gRPC: one call's size, each tenant's and the server's total. A client
// that sends faster than the server answers is refused RESOURCE_EXHAUSTED naming the cap
// (back-pressure: it waits for its answers and sends again) instead of growing the server's
// memory. Thread-safe.
class UcxCallBudget {
 public:
  struct Caps {
    uint64_t call_bytes = uint64_t{256} << 20;  // --data_plane_ucx_call_mb
    uint64_t tenant_bytes = uint64_t{1} << 30;  // --data_plane_ucx_tenant_mb
    uint64_t total_bytes = uint64_t{4} << 30;   // --data_plane_ucx_memory_mb
  };
  explicit UcxCallBudget(Caps caps) : caps_(caps) {}

  const Caps& caps() const { return caps_; }
  // Room for a call of `bytes` for `tenant` (nullptr: single-tenant), or RESOURCE_EXHAUSTED
  // naming the cap and its flag; nothing is taken on a refusal.
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

#endif  // MLASERVE_SERVER_DATAPLANE_UCX_CALL_BUDGET_H_
