#ifndef MLASERVE_SERVER_DATAPLANE_BYTE_BUDGET_H_
#define MLASERVE_SERVER_DATAPLANE_BYTE_BUDGET_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/service/tenancy.h"

namespace mlaserve::dataplane {

// Caps on the bytes a data plane holds for its clients, as --grpc_memory bounds what gRPC
// holds: one item's size (a registered region, a call in flight), each tenant's total and the
// server's total. A client past a cap is refused, not given the server's memory. Thread-safe.
class ByteBudget {
 public:
  struct Caps {
    uint64_t item_bytes = 0;
    uint64_t tenant_bytes = 0;
    uint64_t total_bytes = 0;
  };
  // How a refusal names what is counted and the flags of the caps:
  // "region: tenant 'a' holds 150 registered bytes; 60 more pass its 200 (--data_plane_tenant_mb)".
  struct Wording {
    const char* item;       // the refusal's field: "region", "call"
    const char* one_item;   // "one client may register"
    const char* held;       // "registered bytes", "bytes of calls in flight"
    const char* retry;      // appended to the tenant's and the total's refusals ("" for none)
    const char* item_flag;  // "--data_plane_region_mb"
    const char* tenant_flag;
    const char* total_flag;
  };

  ByteBudget(Caps caps, Wording wording) : caps_(caps), wording_(wording) {}

  const Caps& caps() const { return caps_; }
  // Room for `bytes` more for `tenant` (nullptr: single-tenant), or RESOURCE_EXHAUSTED naming
  // the cap it would pass and its flag. Nothing is taken on a refusal.
  absl::Status Take(service::Tenant* tenant, uint64_t bytes);
  void Give(service::Tenant* tenant, uint64_t bytes);
  uint64_t total() const;

 private:
  const Caps caps_;
  const Wording wording_;
  mutable absl::Mutex mu_;
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<service::Tenant*, uint64_t> by_tenant_ ABSL_GUARDED_BY(mu_);
};

// The same-host plane's registered regions (--data_plane_region_mb, _tenant_mb, _memory_mb).
inline constexpr ByteBudget::Caps kDefaultRegionCaps{uint64_t{1} << 30, uint64_t{4} << 30,
                                                     uint64_t{16} << 30};
inline constexpr ByteBudget::Wording kRegionWording{"region",
                                                    "one client may register",
                                                    "registered bytes",
                                                    "",
                                                    "--data_plane_region_mb",
                                                    "--data_plane_tenant_mb",
                                                    "--data_plane_memory_mb"};
// The UCX plane's calls in flight (--data_plane_ucx_call_mb, _tenant_mb, _memory_mb): a
// client that sends faster than the server answers waits for its answers and sends again.
inline constexpr ByteBudget::Caps kDefaultUcxCallCaps{uint64_t{256} << 20, uint64_t{1} << 30,
                                                      uint64_t{4} << 30};
inline constexpr ByteBudget::Wording kUcxCallWording{"call",
                                                     "one call may take",
                                                     "bytes of calls in flight",
                                                     "; retry after the answers",
                                                     "--data_plane_ucx_call_mb",
                                                     "--data_plane_ucx_tenant_mb",
                                                     "--data_plane_ucx_memory_mb"};

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_BYTE_BUDGET_H_
