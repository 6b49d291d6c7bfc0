#include "server/service/tenant_scope.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "server/engine/kv/client_id.h"

namespace mlaserve::service {
namespace {

using engine::CheckClientId;
using engine::ClientPart;
using engine::NamespacedId;

// A required id: checked, then namespaced.
absl::Status Scope(Tenant* tenant, absl::string_view field, std::string* id) {
  if (tenant == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(CheckClientId(field, *id));
  *id = NamespacedId(tenant->name, *id);
  return absl::OkStatus();
}

// An id that may be empty (none).
absl::Status ScopeOptional(Tenant* tenant, absl::string_view field, std::string* id) {
  if (id->empty()) return absl::OkStatus();
  return Scope(tenant, field, id);
}

void Unscope(Tenant* tenant, std::string* id) {
  if (tenant != nullptr) *id = std::string(ClientPart(*id));
}

const char* RightName(int right) {
  switch (right) {
    case kRead:
      return "read";
    case kWrite:
      return "write";
    default:
      return "decode";
  }
}

}  // namespace

absl::Status ScopeIds(Tenant* tenant, v1::RegisterPrefixRequest& r) {
  RETURN_IF_ERROR(Scope(tenant, "prefix_id", r.mutable_prefix_id()));
  return ScopeOptional(tenant, "parent_id", r.mutable_parent_id());
}

absl::Status ScopeIds(Tenant* tenant, v1::ReleasePrefixRequest& r) {
  return Scope(tenant, "prefix_id", r.mutable_prefix_id());
}

absl::Status ScopeIds(Tenant* tenant, v1::CreateSequenceRequest& r) {
  RETURN_IF_ERROR(Scope(tenant, "sequence_id", r.mutable_sequence_id()));
  return ScopeOptional(tenant, "prefix_id", r.mutable_prefix_id());
}

absl::Status ScopeIds(Tenant* tenant, v1::ForkSequenceRequest& r) {
  RETURN_IF_ERROR(Scope(tenant, "source_sequence_id", r.mutable_source_sequence_id()));
  return Scope(tenant, "new_sequence_id", r.mutable_new_sequence_id());
}

absl::Status ScopeIds(Tenant* tenant, v1::ReleaseSequenceRequest& r) {
  return Scope(tenant, "sequence_id", r.mutable_sequence_id());
}

absl::Status ScopeIds(Tenant* tenant, v1::GetSequenceRequest& r) {
  return Scope(tenant, "sequence_id", r.mutable_sequence_id());
}

absl::Status ScopeIds(Tenant* tenant, v1::AppendKvChunk& chunk, absl::string_view field) {
  return Scope(tenant, absl::StrCat(field, ".sequence_id"), chunk.mutable_sequence_id());
}

absl::Status ScopeIds(Tenant* tenant, ParsedDecode& call) {
  if (tenant == nullptr) return absl::OkStatus();
  for (size_t i = 0; i < call.queries.size(); ++i) {
    engine::DecodeQuery& q = call.queries[i];
    if (!q.append_rows.empty() && (tenant->rights & kWrite) == 0) {
      tenant->permission_denials.fetch_add(1, std::memory_order_relaxed);
      return absl::PermissionDeniedError(
          absl::StrCat("queries[", i, "].append: tenant '", tenant->name, "' has no write right"));
    }
    RETURN_IF_ERROR(Scope(tenant, absl::StrCat("queries[", i, "].sequence_id"), &q.sequence_id));
  }
  return absl::OkStatus();
}

void UnscopeIds(Tenant* tenant, v1::Sequence& sequence) {
  Unscope(tenant, sequence.mutable_sequence_id());
  Unscope(tenant, sequence.mutable_prefix_id());
}

absl::Status UnscopeStatus(Tenant* tenant, const absl::Status& status) {
  if (tenant == nullptr || status.ok()) return status;
  // Messages quote ids by their client part already (QuoteId); this catches any other path.
  const std::string mark(1, engine::kNamespaceMark);
  const std::string message =
      absl::StrReplaceAll(status.message(), {{absl::StrCat(mark, tenant->name, mark), ""}});
  return absl::Status(status.code(), message);
}

absl::Status CheckRight(Tenant* tenant, int right, absl::string_view rpc) {
  if (tenant == nullptr || (tenant->rights & right) != 0) return absl::OkStatus();
  tenant->permission_denials.fetch_add(1, std::memory_order_relaxed);
  return absl::PermissionDeniedError(
      absl::StrCat(rpc, ": tenant '", tenant->name, "' has no ", RightName(right), " right"));
}

}  // namespace mlaserve::service
