#ifndef MLASERVE_SERVER_SERVICE_TENANT_SCOPE_H_
#define MLASERVE_SERVER_SERVICE_TENANT_SCOPE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "mlaserve/v1/decode.pb.h"
#include "mlaserve/v1/kv_cache.pb.h"
#include "server/service/decode_codec.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

// A tenant's requests and answers translated between its ids and the engine's: every
// prefix and sequence id of a request moves into the tenant's namespace (engine/kv/
// client_id.h), after the id's own limits are checked (INVALID_ARGUMENT naming the field),
// and every id of an answer and every status message comes back out of it. So whatever ids
// a tenant sends, it reaches only its own state, and it never reads a namespace. With no
// tenant (single-tenant) nothing changes.
absl::Status ScopeIds(Tenant* tenant, v1::RegisterPrefixRequest& request);
absl::Status ScopeIds(Tenant* tenant, v1::ReleasePrefixRequest& request);
absl::Status ScopeIds(Tenant* tenant, v1::CreateSequenceRequest& request);
absl::Status ScopeIds(Tenant* tenant, v1::ForkSequenceRequest& request);
absl::Status ScopeIds(Tenant* tenant, v1::ReleaseSequenceRequest& request);
absl::Status ScopeIds(Tenant* tenant, v1::GetSequenceRequest& request);
// `field`: "chunks[i]".
absl::Status ScopeIds(Tenant* tenant, v1::AppendKvChunk& chunk, absl::string_view field);
// A decode call's sequence ids; appends need the write right. Fields are named as the list
// form's ("queries[i].sequence_id"); the dispatcher renames them for a packed call.
absl::Status ScopeIds(Tenant* tenant, ParsedDecode& call);

void UnscopeIds(Tenant* tenant, v1::Sequence& sequence);
absl::Status UnscopeStatus(Tenant* tenant, const absl::Status& status);

// PERMISSION_DENIED naming the tenant and the right `rpc` needs, unless it has `right`.
absl::Status CheckRight(Tenant* tenant, int right, absl::string_view rpc);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_TENANT_SCOPE_H_
