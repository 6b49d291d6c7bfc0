#include "server/engine/kv/kv_store.h"

// KvStore's prefixes: registration (reserve, copy outside the lock, publish), release and
// lookup, and the references that keep a prefix node alive and free it when they end.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/tiling.h"
#include "server/engine/kv/client_id.h"
#include "server/engine/kv/kv_store_internal.h"
#include "server/engine/kv/tsan_visible_lock.h"

namespace mlaserve::engine {

// A registration between its reservation and its publication, or (existing) a repeated one
// whose rows are being compared.
struct KvStore::RegisterReservation {
  PrefixNode* node = nullptr;  // referenced (existing) or not yet ready (new)
  bool existing = false;
  int32_t begin = 0;
  std::vector<std::vector<int32_t>> pages;  // [layer] the node's page list
  std::vector<int32_t> cow_sources;         // [layer] parent's last page to copy, or -1
  KvDtype kv_dtype = KvDtype::kBf16;
};

absl::Status KvStore::RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                                     TensorView<const Bf16, 3> latent,
                                     std::optional<KvDtype> kv_dtype) {
  RETURN_IF_ERROR(CheckClientId("prefix_id", prefix_id));
  if (!parent_id.empty()) RETURN_IF_ERROR(CheckClientId("parent_id", parent_id));
  if (latent.dim(0) != model_.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent has ", latent.dim(0), " layers but the model has ", model_.layers));
  }
  if (latent.dim(1) < 1) return absl::InvalidArgumentError("latent holds no tokens");
  if (latent.dim(2) != model_.dk_latent()) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent rows are ", latent.dim(2),
                     " wide but the model's are dl + dr = ", model_.dk_latent()));
  }
  if (latent.stride(2) != 1) return absl::InvalidArgumentError("latent rows must be contiguous");

  ASSIGN_OR_RETURN(RegisterReservation reservation,
                   ReserveRegister(prefix_id, parent_id, latent, kv_dtype));
  if (reservation.existing) {
    const bool same = SameRows(reservation, latent);
    TsanVisibleLock lock(&mu_);
    if (same) tree_.Touch(reservation.node);
    DropReference(reservation.node);
    if (!same) {
      return absl::AlreadyExistsError(
          absl::StrCat("prefix ", QuoteId(prefix_id), " is already registered with other rows"));
    }
    return absl::OkStatus();
  }
  const KvDtype dtype = reservation.kv_dtype;
  const int page_size = pool_.page_tokens(dtype);
  for (int layer = 0; layer < model_.layers; ++layer) {
    const std::vector<int32_t>& pages = reservation.pages[layer];
    if (reservation.cow_sources[layer] >= 0) {
      pool_.CopyRows(dtype, reservation.cow_sources[layer], pages[reservation.begin / page_size],
                     reservation.begin % page_size);
    }
    pool_.WriteTokens(dtype, pages, reservation.begin, latent.row(layer, 0), latent.stride(1),
                      latent.dim(1));
  }
  PublishRegister(reservation);
  return absl::OkStatus();
}

absl::StatusOr<KvStore::RegisterReservation> KvStore::ReserveRegister(
    absl::string_view prefix_id, absl::string_view parent_id, TensorView<const Bf16, 3> latent,
    std::optional<KvDtype> kv_dtype) {
  const int64_t tokens = latent.dim(1);
  TsanVisibleLock lock(&mu_);
  PrefixNode* existing = nullptr;
  PrefixNode* parent = nullptr;
  for (;;) {
    existing = tree_.FindRegistered(prefix_id);
    if (!parent_id.empty()) parent = tree_.FindRegistered(parent_id);
    if ((existing != nullptr && !existing->ready) || (parent != nullptr && !parent->ready)) {
      TsanVisibleWait(published_, &mu_);
      continue;
    }
    break;
  }

  RegisterReservation r;
  if (existing != nullptr) {
    if (existing->parent_id != parent_id || existing->end - existing->begin != tokens ||
        (kv_dtype.has_value() && *kv_dtype != existing->kv_dtype)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "prefix ", QuoteId(prefix_id), " is already registered with ",
          existing->parent_id.empty() ? "no parent"
                                      : absl::StrCat("parent ", QuoteId(existing->parent_id)),
          ", ", existing->end - existing->begin, " tokens, in ", KvDtypeName(existing->kv_dtype)));
    }
    tree_.AddReference(existing);  // keeps its rows while they are compared without the lock
    r.node = existing;
    r.existing = true;
    r.begin = existing->begin;
    r.pages = existing->pages;
    r.kv_dtype = existing->kv_dtype;
    return r;
  }
  if (!parent_id.empty() && parent == nullptr) {
    return absl::NotFoundError(absl::StrCat("parent prefix ", QuoteId(parent_id),
                                            " is not registered (never, released or evicted)"));
  }
  const KvDtype dtype = kv_dtype.value_or(parent != nullptr ? parent->kv_dtype : default_kv_dtype_);
  if (parent != nullptr && dtype != parent->kv_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_dtype: prefix ", QuoteId(prefix_id), " is asked to hold ", KvDtypeName(dtype),
        " rows but its parent ", QuoteId(parent_id), " holds ", KvDtypeName(parent->kv_dtype),
        " (a child shares its parent's pages, so it keeps its format)"));
  }
  r.kv_dtype = dtype;

  const int page_size = pool_.page_tokens(dtype);
  const int32_t begin = parent == nullptr ? 0 : parent->end;
  if (begin + tokens > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix ", QuoteId(prefix_id), " would end at token ", begin + tokens, ", past 2^31 - 1"));
  }
  const auto end = static_cast<int32_t>(begin + tokens);
  const int64_t shared_pages = begin / page_size;  // the parent's full pages
  const int64_t new_pages = CeilDiv(end, page_size) - shared_pages;
  // The parent is about to gain a child: reference it first so making room cannot evict it.
  if (parent != nullptr) tree_.AddReference(parent);
  const int32_t account = AccountOf(prefix_id);
  if (absl::Status s = Reserve(new_pages * model_.layers * pool_.page_bytes(),
                               absl::StrCat("registering prefix ", QuoteId(prefix_id)), account);
      !s.ok()) {
    if (parent != nullptr) DropReference(parent);
    return s;
  }

  auto node = std::make_unique<PrefixNode>();
  node->id = std::string(prefix_id);
  node->parent_id = std::string(parent_id);
  node->parent = parent;
  node->begin = begin;
  node->end = end;
  node->kv_dtype = dtype;
  node->pages.resize(model_.layers);
  r.begin = begin;
  r.cow_sources.assign(model_.layers, -1);
  for (int layer = 0; layer < model_.layers; ++layer) {
    std::vector<int32_t>& pages = node->pages[layer];
    for (int64_t i = 0; i < shared_pages; ++i) {
      pages.push_back(parent->pages[layer][i]);
      pages_.AddOwner(pages.back(), PageOwner::kPrefix);
    }
    for (int64_t i = 0; i < new_pages; ++i) {
      pages.push_back(pages_.Allocate(PageOwner::kPrefix, account));
    }
    if (begin % page_size != 0) r.cow_sources[layer] = parent->pages[layer][shared_pages];
  }
  r.pages = node->pages;
  r.node = tree_.Insert(std::move(node));
  return r;
}

bool KvStore::SameRows(const RegisterReservation& existing,
                       TensorView<const Bf16, 3> latent) const {
  for (int layer = 0; layer < model_.layers; ++layer) {
    if (!pool_.HoldsRows(existing.kv_dtype, existing.pages[layer], existing.begin,
                         latent.row(layer, 0), latent.stride(1), latent.dim(1))) {
      return false;
    }
  }
  return true;
}

void KvStore::PublishRegister(const RegisterReservation& reservation) {
  TsanVisibleLock lock(&mu_);
  reservation.node->ready = true;
  tree_.Touch(reservation.node);
  published_.SignalAll();
}

absl::Status KvStore::ReleasePrefix(absl::string_view prefix_id) {
  RETURN_IF_ERROR(CheckClientId("prefix_id", prefix_id));
  TsanVisibleLock lock(&mu_);
  for (;;) {
    PrefixNode* node = tree_.FindRegistered(prefix_id);
    if (node == nullptr) return absl::OkStatus();
    if (!node->ready) {
      TsanVisibleWait(published_, &mu_);
      continue;
    }
    Unregister(node);
    return absl::OkStatus();
  }
}

absl::StatusOr<PrefixInfo> KvStore::GetPrefix(absl::string_view prefix_id) const {
  RETURN_IF_ERROR(CheckClientId("prefix_id", prefix_id));
  TsanVisibleLock lock(&mu_);
  for (;;) {
    const PrefixNode* node = tree_.FindRegistered(prefix_id);
    if (node == nullptr) {
      return absl::NotFoundError(absl::StrCat("prefix ", QuoteId(prefix_id), " is not registered"));
    }
    if (!node->ready) {
      TsanVisibleWait(published_, &mu_);
      continue;
    }
    return PrefixInfo{node->id,      node->key, node->parent_id,
                      node->begin,   node->end, node->references > 0,
                      node->kv_dtype};
  }
}

void KvStore::DropReference(PrefixNode* node) {
  if (tree_.DropReference(node)) FreeNode(node);
}

void KvStore::Unregister(PrefixNode* node) {
  if (tree_.Unregister(node)) FreeNode(node);
}

void KvStore::FreeNode(PrefixNode* node) {
  for (const std::vector<int32_t>& layer_pages : node->pages) {
    for (int32_t page : layer_pages) pages_.DropOwner(page, PageOwner::kPrefix);
  }
  expanded_.FreeAll(node->key, model_.layers);
  if (PrefixNode* parent = tree_.Erase(node); parent != nullptr) DropReference(parent);
}

}  // namespace mlaserve::engine
