#ifndef MLASERVE_SERVER_SERVICE_DATA_PLANE_TICKETS_H_
#define MLASERVE_SERVER_SERVICE_DATA_PLANE_TICKETS_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

// Tickets that carry a caller authenticated on gRPC (its tenant) onto a data plane: issued by
// OpenDataPlane, presented once on the plane. 128 random bits from the kernel, single use,
// valid for `ttl`. Thread-safe.
class DataPlaneTickets {
 public:
  explicit DataPlaneTickets(absl::Duration ttl = absl::Seconds(60)) : ttl_(ttl) {}

  absl::Duration ttl() const { return ttl_; }
  // A new ticket for `tenant` (nullptr: single-tenant).
  std::string Issue(Tenant* tenant);
  // The ticket's tenant; the ticket is spent. UNAUTHENTICATED if it is unknown, spent or
  // expired.
  absl::StatusOr<Tenant*> Redeem(absl::string_view ticket);

 private:
  struct Issued {
    Tenant* tenant;
    absl::Time expires;
  };
  const absl::Duration ttl_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Issued> issued_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_DATA_PLANE_TICKETS_H_
