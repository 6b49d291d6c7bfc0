#include "server/dataplane/region_budget.h"

#include "absl/strings/str_cat.h"

namespace mlaserve::dataplane {

absl::Status RegionBudget::Take(service::Tenant* tenant, uint64_t bytes) {
  if (bytes > caps_.region_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("region: ", bytes, " bytes exceed the ",
                                                     caps_.region_bytes,
                                                     " one client may register "
                                                     "(--data_plane_region_mb)"));
  }
  absl::MutexLock lock(&mu_);
  const auto it = by_tenant_.find(tenant);
  const uint64_t held = it == by_tenant_.end() ? 0 : it->second;
  if (tenant != nullptr && held + bytes > caps_.tenant_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("region: tenant '", tenant->name, "' holds ", held, " registered bytes; ",
                     bytes, " more pass its ", caps_.tenant_bytes, " (--data_plane_tenant_mb)"));
  }
  if (total_ + bytes > caps_.total_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("region: clients hold ", total_, " registered bytes; ", bytes,
                     " more pass the server's ", caps_.total_bytes, " (--data_plane_memory_mb)"));
  }
  by_tenant_[tenant] += bytes;
  total_ += bytes;
  return absl::OkStatus();
}

void RegionBudget::Give(service::Tenant* tenant, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  total_ -= bytes;
  auto it = by_tenant_.find(tenant);
  if (it != by_tenant_.end() && (it->second -= bytes) == 0) by_tenant_.erase(it);
}

uint64_t RegionBudget::total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace mlaserve::dataplane
