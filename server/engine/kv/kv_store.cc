#include "server/engine/kv/kv_store.h"

// KvStore's core: construction, stats, and the budget (reservation, accounts, eviction). The
// rest of the class is in kv_store_prefixes.cc, kv_store_listings.cc, kv_store_sequences.cc,
// kv_store_decode.cc and kv_store_restarts.cc.

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/kv/client_id.h"
#include "server/engine/kv/eviction.h"
#include "server/engine/kv/kv_store_internal.h"
#include "server/engine/kv/tsan_visible_lock.h"

namespace mlaserve::engine {
namespace {

constexpr int kMaxPageSize = 65536;

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Create(const ModelConfig& model,
                                                         const KvStoreOptions& options) {
  RETURN_IF_ERROR(model.Validate());
  if (options.page_size < 1 || options.page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("kv store: page_size = ", options.page_size,
                                                   " is outside [1, ", kMaxPageSize, "]"));
  }
  const int64_t page_bytes = static_cast<int64_t>(options.page_size) * model.dk_latent() *
                             static_cast<int64_t>(sizeof(Bf16));
  if (options.budget_bytes < page_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv store: budget_bytes = ", options.budget_bytes, " is less than one page (",
                     page_bytes, " bytes)"));
  }
  const int64_t num_pages = options.budget_bytes / page_bytes;
  if (num_pages > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv store: budget_bytes = ", options.budget_bytes, " makes ", num_pages,
                     " pages, more than int32 page ids can name; use larger pages"));
  }
  ASSIGN_OR_RETURN(PagePool pool,
                   PagePool::Create(static_cast<int32_t>(num_pages), options.page_size, model.dl,
                                    model.dr, options.page_writes));
  return std::unique_ptr<KvStore>(new KvStore(model, options, std::move(pool)));
}

KvStore::KvStore(const ModelConfig& model, const KvStoreOptions& options, PagePool pool)
    : model_(model),
      budget_bytes_(options.budget_bytes),
      default_kv_dtype_(options.default_kv_dtype),
      pool_(std::move(pool)),
      expansions_(options.expansions),
      pages_(pool_.num_pages()),
      namespace_budgets_(options.namespace_budget_bytes) {}

KvStore::~KvStore() = default;

absl::Status KvStore::CheckLayer(int layer) const {
  if (layer < 0 || layer >= model_.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is outside [0, ", model_.layers, ")"));
  }
  return absl::OkStatus();
}

KvStoreStats KvStore::Stats() const {
  TsanVisibleLock lock(&mu_);
  const PageCounts counts = pages_.counts();
  KvStoreStats stats;
  stats.budget_bytes = budget_bytes_;
  stats.used_bytes = UsedBytes();
  stats.page_bytes = pool_.page_bytes();
  stats.page_tokens_bf16 = pool_.page_tokens(KvDtype::kBf16);
  stats.page_tokens_fp8 = pool_.page_tokens(KvDtype::kFp8);
  stats.pages_total = pages_.num_pages();
  stats.pages_free = counts.free;
  stats.pages_used = stats.pages_total - counts.free;
  stats.pages_prefix = counts.prefix;
  stats.pages_sequence = counts.sequence;
  stats.pages_pinned = counts.pinned;
  stats.pages_touched = pages_.num_touched();
  stats.expanded_bytes = expanded_.bytes();
  stats.expanded_entries = expanded_.entries();
  stats.prefixes = tree_.registered();
  stats.retained_prefixes = tree_.retained();
  stats.sequences = static_cast<int32_t>(sequences_.size());
  stats.prefix_evictions = prefix_evictions_;
  stats.expanded_evictions = expanded_evictions_;
  for (int32_t account = 1; account < static_cast<int32_t>(account_names_.size()); ++account) {
    stats.namespace_used_bytes[account_names_[account]] =
        int64_t{pages_.account_pages(account)} * pool_.page_bytes();
  }
  return stats;
}

// --- Budget and eviction --------------------------------------------------------------------

int64_t KvStore::UsedBytes() const {
  return static_cast<int64_t>(pages_.num_pages() - pages_.num_free()) * pool_.page_bytes() +
         expanded_.bytes();
}

int32_t KvStore::AccountOf(absl::string_view id) {
  const absl::string_view name = IdNamespace(id);
  if (name.empty()) return 0;
  const auto [it, added] = accounts_.try_emplace(name, static_cast<int32_t>(account_names_.size()));
  if (added) account_names_.emplace_back(name);
  return it->second;
}

absl::Status KvStore::Reserve(int64_t bytes, absl::string_view what, int32_t account) {
  if (account > 0) {
    const std::string& name = account_names_[account];
    if (const auto quota = namespace_budgets_.find(name); quota != namespace_budgets_.end()) {
      const int64_t held = int64_t{pages_.account_pages(account)} * pool_.page_bytes();
      if (held + bytes > quota->second) {
        // Over its own quota a tenant evicts nothing: other tenants' prefixes are not its to
        // drop, and its own unreferenced ones it can release.
        return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes, " bytes; tenant '",
                                                         name, "' holds ", held, " of its ",
                                                         quota->second, "-byte KV quota"));
      }
    }
  }
  const int64_t over = UsedBytes() + bytes - budget_bytes_;
  if (over <= 0) return absl::OkStatus();
  const std::optional<EvictionPlan> plan =
      PlanEviction(tree_, expanded_, pages_, pool_.page_bytes(), model_.layers, over);
  if (!plan.has_value()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " needs ", bytes, " bytes; the budget is ", budget_bytes_,
                     " bytes with ", UsedBytes(),
                     " in use, and evicting every unreferenced prefix and expansion would not "
                     "free enough"));
  }
  for (const EvictionPlan::Victim& victim : plan->victims) {
    if (victim.layer >= 0) {
      expanded_.Free(victim.node->key, victim.layer);
      ++expanded_evictions_;
    } else {
      ++prefix_evictions_;
      Unregister(victim.node);
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::engine
