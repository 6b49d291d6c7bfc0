#include "server/service/admin_requests.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/kv/client_id.h"
#include "server/service/kv_request_codec.h"

namespace mlaserve::service {
namespace {

constexpr int kMaxPageSize = 1000;
constexpr int kDefaultPageSize = 100;

std::string Namespace(const Tenant* tenant) { return tenant == nullptr ? "" : tenant->name; }

// The engine's range for a request's page_size and page_token, in the tenant's namespace.
absl::StatusOr<engine::ListRange> Range(const Tenant* tenant, int32_t page_size,
                                        const std::string& page_token) {
  if (page_size < 0 || page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("page_size: ", page_size, " is not in 0..",
                                                   kMaxPageSize, " (0: ", kDefaultPageSize, ")"));
  }
  if (!page_token.empty()) RETURN_IF_ERROR(engine::CheckClientId("page_token", page_token));
  engine::ListRange range;
  range.limit = page_size == 0 ? kDefaultPageSize : page_size;
  range.id_prefix = engine::NamespacedId(Namespace(tenant), "");
  if (!page_token.empty()) range.after = engine::NamespacedId(Namespace(tenant), page_token);
  return range;
}

// The client's own part of an engine id (a tenant never reads a namespace).
std::string Own(absl::string_view id) { return std::string(engine::ClientPart(id)); }

}  // namespace

absl::Status ListPrefixesOnEngine(const engine::Engine& engine, Tenant* tenant,
                                  const v1::ListPrefixesRequest& request,
                                  v1::ListPrefixesResponse* response) {
  ASSIGN_OR_RETURN(const engine::ListRange range,
                   Range(tenant, request.page_size(), request.page_token()));
  engine::ListPage<engine::PrefixListing> page = engine.ListPrefixes(range);
  for (const engine::PrefixListing& p : page.entries) {
    v1::PrefixSummary* summary = response->add_prefixes();
    summary->set_prefix_id(Own(p.info.id));
    summary->set_parent_id(Own(p.info.parent_id));
    summary->set_tokens(p.info.end);
    summary->set_own_tokens(p.info.end - p.info.begin);
    summary->set_kv_dtype(ToWire(p.info.kv_dtype));
    summary->set_referenced(p.info.referenced);
    summary->set_pages(p.pages);
  }
  if (page.more) response->set_next_page_token(response->prefixes().rbegin()->prefix_id());
  return absl::OkStatus();
}

absl::Status ListSequencesOnEngine(const engine::Engine& engine, Tenant* tenant,
                                   const v1::ListSequencesRequest& request,
                                   v1::ListSequencesResponse* response) {
  ASSIGN_OR_RETURN(const engine::ListRange range,
                   Range(tenant, request.page_size(), request.page_token()));
  std::string on_prefix;
  if (!request.prefix_id().empty()) {
    RETURN_IF_ERROR(engine::CheckClientId("prefix_id", request.prefix_id()));
    on_prefix = engine::NamespacedId(Namespace(tenant), request.prefix_id());
  }
  engine::ListPage<engine::SequenceListing> page = engine.ListSequences(range, on_prefix);
  for (const engine::SequenceListing& s : page.entries) {
    v1::SequenceSummary* summary = response->add_sequences();
    v1::Sequence* sequence = summary->mutable_sequence();
    sequence->set_sequence_id(Own(s.info.id));
    sequence->set_prefix_id(Own(s.info.prefix_id));
    sequence->mutable_layer_lengths()->Add(s.info.lengths.begin(), s.info.lengths.end());
    sequence->set_kv_dtype(ToWire(s.info.kv_dtype));
    summary->set_pages(s.pages);
    summary->set_shared_pages(s.shared_pages);
  }
  if (page.more) {
    response->set_next_page_token(response->sequences().rbegin()->sequence().sequence_id());
  }
  return absl::OkStatus();
}

absl::Status GetStatsOnEngine(const engine::Engine& engine, Tenant* tenant, const Tenancy* tenancy,
                              v1::GetStatsResponse* response) {
  const engine::EngineStats stats = engine.Stats();
  const engine::KvStoreStats& kv = stats.kv;
  if (tenant == nullptr) {
    response->set_kv_pages_total(kv.pages_total);
    response->set_kv_pages_used(kv.pages_used);
    response->set_kv_bytes_budget(kv.budget_bytes);
    response->set_kv_bytes_used(kv.used_bytes);
    response->set_kv_bytes_expanded(kv.expanded_bytes);
    response->set_prefixes(kv.prefixes);
    response->set_retained_prefixes(kv.retained_prefixes);
    response->set_sequences(kv.sequences);
    response->set_prefix_evictions(kv.prefix_evictions);
    response->set_expanded_evictions(kv.expanded_evictions);
    response->set_decode_queued(stats.queued);
    return absl::OkStatus();
  }
  // A tenant sees its own share of the store, never another tenant's or the total's use.
  response->set_tenant(tenant->name);
  int64_t quota = 0;
  if (tenancy != nullptr) {
    const std::map<std::string, int64_t> quotas = tenancy->KvQuotas();
    if (const auto q = quotas.find(tenant->name); q != quotas.end()) quota = q->second;
  }
  response->set_tenant_kv_quota_bytes(quota);
  const auto used = kv.namespace_used_bytes.find(tenant->name);
  const int64_t used_bytes = used == kv.namespace_used_bytes.end() ? 0 : used->second;
  const int64_t budget = quota > 0 ? std::min(quota, kv.budget_bytes) : kv.budget_bytes;
  response->set_kv_bytes_budget(budget);
  response->set_kv_bytes_used(used_bytes);
  if (kv.page_bytes > 0) {
    response->set_kv_pages_total(budget / kv.page_bytes);
    response->set_kv_pages_used(used_bytes / kv.page_bytes);
  }
  engine::ListRange everything;
  everything.id_prefix = engine::NamespacedId(tenant->name, "");
  everything.limit = 0;
  response->set_prefixes(engine.ListPrefixes(everything).matching);
  response->set_sequences(engine.ListSequences(everything, "").matching);
  response->set_decode_queued(tenant->queued_queries.load(std::memory_order_relaxed));
  return absl::OkStatus();
}

}  // namespace mlaserve::service
