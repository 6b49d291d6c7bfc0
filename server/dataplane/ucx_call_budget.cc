#include "server/dataplane/ucx_call_budget.h"

#include "absl/strings/str_cat.h"

namespace mlaserve::dataplane {

absl::Status UcxCallBudget::Take(service::Tenant* tenant, uint64_t bytes) {
  if (bytes > caps_.call_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("call: ", bytes, " bytes exceed the ",
                                                     caps_.call_bytes,
                                                     " one call may take "
                                                     "(--data_plane_ucx_call_mb)"));
  }
  absl::MutexLock lock(&mu_);
  const auto it = by_tenant_.find(tenant);
  const uint64_t held = it == by_tenant_.end() ? 0 : it->second;
  if (tenant != nullptr && held + bytes > caps_.tenant_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("call: tenant '", tenant->name, "' has ", held, " bytes of calls in flight; ",
                     bytes, " more pass its ", caps_.tenant_bytes,
                     " (--data_plane_ucx_tenant_mb); retry after its answers"));
  }
  if (total_ + bytes > caps_.total_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("call: clients have ", total_, " bytes of calls in flight; ", bytes,
                     " more pass the server's ", caps_.total_bytes,
                     " (--data_plane_ucx_memory_mb); retry after their answers"));
  }
  by_tenant_[tenant] += bytes;
  total_ += bytes;
  return absl::OkStatus();
}

void UcxCallBudget::Give(service::Tenant* tenant, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  total_ -= bytes;
  auto it = by_tenant_.find(tenant);
  if (it != by_tenant_.end() && (it->second -= bytes) == 0) by_tenant_.erase(it);
}

uint64_t UcxCallBudget::total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace mlaserve::dataplane
