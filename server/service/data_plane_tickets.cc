#include "server/service/data_plane_tickets.h"

#include <sys/random.h>

#include "absl/time/clock.h"

namespace mlaserve::service {

std::string DataPlaneTickets::Issue(Tenant* tenant) {
  std::string ticket(16, '\0');
  size_t got = 0;
  while (got < ticket.size()) {
    const ssize_t n = getrandom(ticket.data() + got, ticket.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  // Expired tickets go as new ones come, so the map holds at most a ttl's worth.
  absl::erase_if(issued_, [now](const auto& entry) { return entry.second.expires < now; });
  issued_[ticket] = Issued{tenant, now + ttl_};
  return ticket;
}

absl::StatusOr<Tenant*> DataPlaneTickets::Redeem(absl::string_view ticket) {
  absl::MutexLock lock(&mu_);
  const auto it = issued_.find(ticket);
  if (it == issued_.end() || it->second.expires < absl::Now()) {
    if (it != issued_.end()) issued_.erase(it);
    return absl::UnauthenticatedError(
        "ticket: not one this server issued, already used, or expired; ask OpenDataPlane for "
        "another");
  }
  Tenant* tenant = it->second.tenant;
  issued_.erase(it);
  return tenant;
}

}  // namespace mlaserve::service
