#include "server/dataplane/byte_budget.h"

#include "absl/strings/str_cat.h"

namespace mlaserve::dataplane {

absl::Status ByteBudget::Take(service::Tenant* tenant, uint64_t bytes) {
  const Wording& w = wording_;
  if (bytes > caps_.item_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(w.item, ": ", bytes, " bytes exceed the ",
                                                     caps_.item_bytes, " ", w.one_item, " (",
                                                     w.item_flag, ")"));
  }
  absl::MutexLock lock(&mu_);
  if (tenant != nullptr) {
    const auto it = by_tenant_.find(tenant);
    const uint64_t held = it == by_tenant_.end() ? 0 : it->second;
    if (held + bytes > caps_.tenant_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          w.item, ": tenant '", tenant->name, "' holds ", held, " ", w.held, "; ", bytes,
          " more pass its ", caps_.tenant_bytes, " (", w.tenant_flag, ")", w.retry));
    }
  }
  if (total_ + bytes > caps_.total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        w.item, ": clients hold ", total_, " ", w.held, "; ", bytes, " more pass the server's ",
        caps_.total_bytes, " (", w.total_flag, ")", w.retry));
  }
  by_tenant_[tenant] += bytes;
  total_ += bytes;
  return absl::OkStatus();
}

void ByteBudget::Give(service::Tenant* tenant, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  total_ -= bytes;
  auto it = by_tenant_.find(tenant);
  if (it != by_tenant_.end() && (it->second -= bytes) == 0) by_tenant_.erase(it);
}

uint64_t ByteBudget::total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace mlaserve::dataplane
