#ifndef MLASERVE_SERVER_SERVICE_ADMIN_REQUESTS_H_
#define MLASERVE_SERVER_SERVICE_ADMIN_REQUESTS_H_

#include "absl/status/status.h"
#include "mlaserve/v1/admin.pb.h"
#include "server/engine/engine.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

// The read-only admin RPCs (admin.proto) on the engine, for the caller's tenant (nullptr:
// single-tenant). A tenant's listing covers its own namespace only and its answer carries
// its own ids. INVALID_ARGUMENT naming page_size (not 0..1000), page_token or prefix_id (not
// an id: docs/api.md, "Ids"); nothing else fails.
absl::Status ListPrefixesOnEngine(const engine::Engine& engine, Tenant* tenant,
                                  const v1::ListPrefixesRequest& request,
                                  v1::ListPrefixesResponse* response);
absl::Status ListSequencesOnEngine(const engine::Engine& engine, Tenant* tenant,
                                   const v1::ListSequencesRequest& request,
                                   v1::ListSequencesResponse* response);

// The KV store's and queue's figures; under tenants, the caller's own KV bytes (against its
// quota from `tenancy`, or the budget), prefixes and sequences, and its queued queries.
absl::Status GetStatsOnEngine(const engine::Engine& engine, Tenant* tenant, const Tenancy* tenancy,
                              v1::GetStatsResponse* response);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_ADMIN_REQUESTS_H_
