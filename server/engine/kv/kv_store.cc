#include "server/engine/kv/kv_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/tiling.h"
#include "server/engine/kv/client_id.h"
#include "server/engine/kv/eviction.h"
#include "server/engine/kv/tsan_visible_lock.h"

namespace mlaserve::engine {
namespace {

constexpr int kMaxPageSize = 65536;
constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();

}  // namespace

struct KvStore::Sequence {
  // How it came to be, so that a retried create or fork can be recognised.
  enum class Origin { kCreated, kForked };

  struct Layer {
    std::vector<int32_t> pages;  // ceil(length / page_size) pages
    int32_t length = 0;
    bool appending = false;  // rows are being copied in outside the lock
  };

  std::string id;
  Origin origin = Origin::kCreated;
  std::string origin_id;         // the prefix id it was created on, or the fork source
  PrefixNode* prefix = nullptr;  // referenced by this sequence
  KvDtype kv_dtype = KvDtype::kBf16;
  std::vector<Layer> layers;
};

// An append between its reservation and its publication.
struct KvStore::AppendReservation {
  Sequence* sequence = nullptr;  // cannot go away: release waits for the append
  int layer = 0;
  int64_t first_token = 0;
  int64_t rows = 0;
  // The pages the rows land in: the current last page (or its copy) if it has room, then
  // the new ones. Token first_token sits at row first_token % page_size of targets[0].
  std::vector<int32_t> targets;
  int32_t cow_source = -1;  // the shared last page copied into targets[0], or -1
  int cow_rows = 0;
  KvDtype kv_dtype = KvDtype::kBf16;  // the sequence's
};

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
  ASSIGN_OR_RETURN(PagePool pool, PagePool::Create(static_cast<int32_t>(num_pages),
                                                   options.page_size, model.dl, model.dr));
  return std::unique_ptr<KvStore>(new KvStore(model, options, std::move(pool)));
}

KvStore::KvStore(const ModelConfig& model, const KvStoreOptions& options, PagePool pool)
    : model_(model),
      budget_bytes_(options.budget_bytes),
      default_kv_dtype_(options.default_kv_dtype),
      pool_(std::move(pool)),
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

bool KvStore::Appending(const Sequence& sequence) {
  return std::any_of(sequence.layers.begin(), sequence.layers.end(),
                     [](const Sequence::Layer& l) { return l.appending; });
}

// --- Prefixes -------------------------------------------------------------------------------

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

namespace {

// Keeps the `range.limit` smallest of the entries it is offered (by id) and counts them all,
// so a page costs one pass over what the store holds and no sort of all of it.
template <typename Entry>
class PageCollector {
 public:
  explicit PageCollector(const ListRange& range) : range_(range) {}

  bool InRange(absl::string_view id) const {
    return absl::StartsWith(id, range_.id_prefix) && (range_.after.empty() || id > range_.after);
  }
  void Offer(Entry entry) {
    ++page_.matching;
    page_.entries.push_back(std::move(entry));
    // Trim now and then rather than per entry: a heap of limit + 1 would do the same work.
    if (page_.entries.size() > 2 * static_cast<size_t>(range_.limit) + 64) Trim();
  }
  ListPage<Entry> Take() && {
    Trim();
    return std::move(page_);
  }

 private:
  void Trim() {
    auto by_id = [](const Entry& a, const Entry& b) { return a.info.id < b.info.id; };
    const size_t keep = static_cast<size_t>(std::max(range_.limit, 0));
    if (page_.entries.size() > keep) {
      std::nth_element(page_.entries.begin(), page_.entries.begin() + keep, page_.entries.end(),
                       by_id);
      page_.entries.resize(keep);
    }
    std::sort(page_.entries.begin(), page_.entries.end(), by_id);
    page_.more = page_.matching > static_cast<int64_t>(page_.entries.size());
  }

  const ListRange& range_;
  ListPage<Entry> page_;
};

}  // namespace

ListPage<PrefixListing> KvStore::ListPrefixes(const ListRange& range) const {
  PageCollector<PrefixListing> page(range);
  TsanVisibleLock lock(&mu_);
  for (const auto& [key, node] : tree_.nodes()) {
    if (!node->registered || !node->ready || !page.InRange(node->id)) continue;
    PrefixListing entry{PrefixInfo{node->id, node->key, node->parent_id, node->begin, node->end,
                                   node->references > 0, node->kv_dtype},
                        0};
    for (const std::vector<int32_t>& layer : node->pages) {
      entry.pages += static_cast<int64_t>(layer.size());
    }
    page.Offer(std::move(entry));
  }
  return std::move(page).Take();
}

ListPage<SequenceListing> KvStore::ListSequences(const ListRange& range,
                                                 absl::string_view on_prefix_id) const {
  PageCollector<SequenceListing> page(range);
  TsanVisibleLock lock(&mu_);
  for (const auto& [id, sequence] : sequences_) {
    const Sequence& s = *sequence;
    const absl::string_view prefix_id =
        s.prefix == nullptr ? absl::string_view() : absl::string_view(s.prefix->id);
    if (!page.InRange(id) || (!on_prefix_id.empty() && prefix_id != on_prefix_id)) continue;
    SequenceListing entry{SequenceInfo{s.id, std::string(prefix_id), {}, s.kv_dtype}, 0, 0};
    for (const Sequence::Layer& layer : s.layers) {
      entry.info.lengths.push_back(layer.length);
      entry.pages += static_cast<int64_t>(layer.pages.size());
      for (const int32_t p : layer.pages) entry.shared_pages += pages_.owners(p) > 1 ? 1 : 0;
    }
    page.Offer(std::move(entry));
  }
  return std::move(page).Take();
}

// --- Sequences ------------------------------------------------------------------------------

absl::Status KvStore::CreateSequence(absl::string_view sequence_id, absl::string_view prefix_id,
                                     std::optional<KvDtype> kv_dtype) {
  RETURN_IF_ERROR(CheckClientId("sequence_id", sequence_id));
  if (!prefix_id.empty()) RETURN_IF_ERROR(CheckClientId("prefix_id", prefix_id));
  TsanVisibleLock lock(&mu_);
  PrefixNode* prefix = nullptr;
  for (;;) {
    if (const auto it = sequences_.find(sequence_id); it != sequences_.end()) {
      const Sequence& s = *it->second;
      if (s.origin == Sequence::Origin::kCreated && s.origin_id == prefix_id &&
          kv_dtype.value_or(s.kv_dtype) == s.kv_dtype) {
        return absl::OkStatus();
      }
      return absl::AlreadyExistsError(absl::StrCat(
          "sequence ", QuoteId(sequence_id), " already exists (",
          s.origin == Sequence::Origin::kForked ? "forked from " : "created on prefix ",
          QuoteId(s.origin_id), ")"));
    }
    if (prefix_id.empty()) break;
    prefix = tree_.FindRegistered(prefix_id);
    if (prefix == nullptr) {
      return absl::NotFoundError(absl::StrCat("prefix ", QuoteId(prefix_id),
                                              " is not registered (never, released or evicted)"));
    }
    if (prefix->ready) break;
    TsanVisibleWait(published_, &mu_);
  }
  if (prefix != nullptr && kv_dtype.has_value() && *kv_dtype != prefix->kv_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_dtype: sequence ", QuoteId(sequence_id), " is asked to hold ", KvDtypeName(*kv_dtype),
        " rows but its prefix ", QuoteId(prefix_id), " holds ", KvDtypeName(prefix->kv_dtype),
        " (a sequence reads its prefix's pages, so it keeps their format)"));
  }

  auto sequence = std::make_unique<Sequence>();
  sequence->id = std::string(sequence_id);
  sequence->origin = Sequence::Origin::kCreated;
  sequence->origin_id = std::string(prefix_id);
  sequence->kv_dtype = prefix != nullptr ? prefix->kv_dtype : kv_dtype.value_or(default_kv_dtype_);
  sequence->layers.resize(model_.layers);
  if (prefix != nullptr) {
    sequence->prefix = prefix;
    tree_.AddReference(prefix);
    tree_.Touch(prefix);
    for (int layer = 0; layer < model_.layers; ++layer) {
      Sequence::Layer& l = sequence->layers[layer];
      l.pages = prefix->pages[layer];
      for (int32_t page : l.pages) pages_.AddOwner(page, PageOwner::kSequence);
      l.length = prefix->end;
    }
  }
  sequences_.emplace(sequence->id, std::move(sequence));
  return absl::OkStatus();
}

absl::Status KvStore::ForkSequence(absl::string_view source_id, absl::string_view new_id) {
  RETURN_IF_ERROR(CheckClientId("source_sequence_id", source_id));
  RETURN_IF_ERROR(CheckClientId("new_sequence_id", new_id));
  TsanVisibleLock lock(&mu_);
  Sequence* source = nullptr;
  for (;;) {
    if (const auto it = sequences_.find(new_id); it != sequences_.end()) {
      const Sequence& s = *it->second;
      if (s.origin == Sequence::Origin::kForked && s.origin_id == source_id) {
        return absl::OkStatus();
      }
      return absl::AlreadyExistsError(
          absl::StrCat("sequence ", QuoteId(new_id), " already exists"));
    }
    const auto it = sequences_.find(source_id);
    if (it == sequences_.end()) {
      return absl::NotFoundError(absl::StrCat("sequence ", QuoteId(source_id), " does not exist"));
    }
    source = it->second.get();
    // An append in flight may be writing past the published length of a page the fork
    // would share; once shared, that page's rows must be settled for both sides.
    if (!Appending(*source)) break;
    TsanVisibleWait(published_, &mu_);
  }

  auto fork = std::make_unique<Sequence>();
  fork->id = std::string(new_id);
  fork->origin = Sequence::Origin::kForked;
  fork->origin_id = std::string(source_id);
  fork->prefix = source->prefix;
  fork->kv_dtype = source->kv_dtype;
  if (fork->prefix != nullptr) tree_.AddReference(fork->prefix);
  fork->layers.resize(model_.layers);
  for (int layer = 0; layer < model_.layers; ++layer) {
    Sequence::Layer& l = fork->layers[layer];
    l.pages = source->layers[layer].pages;
    for (int32_t page : l.pages) pages_.AddOwner(page, PageOwner::kSequence);
    l.length = source->layers[layer].length;
  }
  sequences_.emplace(fork->id, std::move(fork));
  return absl::OkStatus();
}

absl::Status KvStore::Append(absl::string_view sequence_id, int layer, int64_t start_position,
                             TensorView<const Bf16, 2> rows) {
  RETURN_IF_ERROR(CheckClientId("sequence_id", sequence_id));
  RETURN_IF_ERROR(CheckLayer(layer));
  if (start_position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_position is negative (", start_position, ")"));
  }
  if (rows.dim(0) < 1) return absl::InvalidArgumentError("rows is empty");
  if (rows.dim(1) != model_.dk_latent()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows are ", rows.dim(1), " wide but the model's are dl + dr = ", model_.dk_latent()));
  }
  if (rows.stride(1) != 1) return absl::InvalidArgumentError("rows must be contiguous");

  ASSIGN_OR_RETURN(std::optional<AppendReservation> reservation,
                   ReserveAppend(sequence_id, layer, start_position, rows.dim(0),
                                 /*fp8_records=*/false));
  if (!reservation.has_value()) return absl::OkStatus();
  const KvDtype dtype = reservation->kv_dtype;
  if (reservation->cow_source >= 0) {
    pool_.CopyRows(dtype, reservation->cow_source, reservation->targets[0], reservation->cow_rows);
  }
  pool_.WriteTokens(dtype, reservation->targets,
                    reservation->first_token % pool_.page_tokens(dtype), rows.data(),
                    rows.stride(0), rows.dim(0));
  PublishAppend(*reservation);
  return absl::OkStatus();
}

absl::Status KvStore::AppendFp8(absl::string_view sequence_id, int layer, int64_t start_position,
                                std::span<const std::byte> records, int64_t n) {
  RETURN_IF_ERROR(CheckClientId("sequence_id", sequence_id));
  RETURN_IF_ERROR(CheckLayer(layer));
  if (start_position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_position is negative (", start_position, ")"));
  }
  if (n < 1) return absl::InvalidArgumentError("rows is empty");
  const Fp8PageLayout& layout = pool_.fp8_layout();
  const int64_t record = Fp8PageLayout::BytesPerToken(layout.dl, layout.dr);
  if (static_cast<int64_t>(records.size()) != n * record) {
    return absl::InvalidArgumentError(absl::StrCat("rows hold ", records.size(), " bytes, not ", n,
                                                   " FP8 rows of ", record, " bytes"));
  }
  for (int64_t r = 0; r < n; ++r) {
    const std::byte* row = records.data() + r * record;
    float scale = 0;
    std::memcpy(&scale, row + layout.dl, sizeof scale);
    if (!std::isfinite(scale) || !(scale > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows[", r, "] has scale ", scale, "; a scale must be finite and positive"));
    }
    for (int c = 0; c < layout.dl; ++c) {
      if ((static_cast<uint8_t>(row[c]) & 0x7f) == 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrCat("rows[", r, "] content[", c, "] is an e4m3 NaN"));
      }
    }
    for (int c = 0; c < layout.dr; ++c) {
      Bf16 v;
      std::memcpy(&v, row + layout.dl + sizeof(float) + c * sizeof(Bf16), sizeof v);
      if (!v.IsFinite()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rows[", r, "] rope[", c, "] is not finite"));
      }
    }
  }
  ASSIGN_OR_RETURN(std::optional<AppendReservation> reservation,
                   ReserveAppend(sequence_id, layer, start_position, n, /*fp8_records=*/true));
  if (!reservation.has_value()) return absl::OkStatus();
  if (reservation->cow_source >= 0) {
    pool_.CopyRows(KvDtype::kFp8, reservation->cow_source, reservation->targets[0],
                   reservation->cow_rows);
  }
  pool_.WriteFp8Records(reservation->targets, reservation->first_token % layout.page_size,
                        records.data(), n);
  PublishAppend(*reservation);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<KvStore::AppendReservation>> KvStore::ReserveAppend(
    absl::string_view sequence_id, int layer, int64_t start_position, int64_t rows,
    bool fp8_records) {
  TsanVisibleLock lock(&mu_);
  Sequence* sequence = nullptr;
  for (;;) {
    const auto it = sequences_.find(sequence_id);
    if (it == sequences_.end()) {
      return absl::NotFoundError(
          absl::StrCat("sequence ", QuoteId(sequence_id), " does not exist"));
    }
    sequence = it->second.get();
    if (fp8_records && sequence->kv_dtype != KvDtype::kFp8) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", QuoteId(sequence_id), " holds ", KvDtypeName(sequence->kv_dtype),
          " rows: append them as bf16 rows, not FP8 ones"));
    }
    if (!sequence->layers[layer].appending) break;
    TsanVisibleWait(published_,
                    &mu_);  // a retry racing its original: decide once that one has landed
  }
  Sequence::Layer& l = sequence->layers[layer];
  if (start_position < l.length && start_position + rows <= l.length) return std::nullopt;
  if (start_position != l.length) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", QuoteId(sequence_id), " layer ", layer, " holds ", l.length,
                     " tokens: an append must start at position ", l.length,
                     " (or retry an earlier range), not ", start_position));
  }
  if (l.length + rows > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", QuoteId(sequence_id), " layer ",
                                                   layer, " would hold ", l.length + rows,
                                                   " tokens, past 2^31 - 1"));
  }
  const int page_size = pool_.page_tokens(sequence->kv_dtype);
  const int cow_rows = l.length % page_size;
  // A partly filled last page that another list holds must be copied before it is written.
  const bool copy_last = cow_rows != 0 && pages_.owners(l.pages.back()) > 1;
  const int64_t new_pages =
      CeilDiv(l.length + rows, page_size) - CeilDiv(l.length, page_size) + (copy_last ? 1 : 0);
  const int32_t account = AccountOf(sequence_id);
  RETURN_IF_ERROR(Reserve(new_pages * pool_.page_bytes(),
                          absl::StrCat("appending ", rows, " tokens to sequence ",
                                       QuoteId(sequence_id), " layer ", layer),
                          account));

  AppendReservation r;
  r.sequence = sequence;
  r.kv_dtype = sequence->kv_dtype;
  r.layer = layer;
  r.first_token = l.length;
  r.rows = rows;
  if (copy_last) {
    r.cow_source = l.pages.back();
    r.cow_rows = cow_rows;
  } else if (cow_rows != 0) {
    r.targets.push_back(l.pages.back());  // ours alone: rows past the length are free to write
  }
  for (int64_t i = 0; i < new_pages; ++i)
    r.targets.push_back(pages_.Allocate(PageOwner::kSequence, account));
  l.appending = true;
  return r;
}

void KvStore::PublishAppend(const AppendReservation& reservation) {
  TsanVisibleLock lock(&mu_);
  Sequence::Layer& l = reservation.sequence->layers[reservation.layer];
  auto fresh = reservation.targets.begin();
  if (reservation.cow_source >= 0) {
    pages_.DropOwner(l.pages.back(), PageOwner::kSequence);
    l.pages.back() = *fresh++;
  } else if (reservation.first_token % pool_.page_tokens(reservation.kv_dtype) != 0) {
    ++fresh;  // the last page, written in place
  }
  l.pages.insert(l.pages.end(), fresh, reservation.targets.end());
  l.length = static_cast<int32_t>(reservation.first_token + reservation.rows);
  l.appending = false;
  published_.SignalAll();
}

absl::Status KvStore::ReleaseSequence(absl::string_view sequence_id) {
  RETURN_IF_ERROR(CheckClientId("sequence_id", sequence_id));
  TsanVisibleLock lock(&mu_);
  for (;;) {
    const auto it = sequences_.find(sequence_id);
    if (it == sequences_.end()) return absl::OkStatus();
    Sequence& sequence = *it->second;
    if (Appending(sequence)) {
      TsanVisibleWait(published_, &mu_);  // the append is writing into pages this would free
      continue;
    }
    for (const Sequence::Layer& l : sequence.layers) {
      for (int32_t page : l.pages) pages_.DropOwner(page, PageOwner::kSequence);
    }
    if (sequence.prefix != nullptr) DropReference(sequence.prefix);
    sequences_.erase(it);
    return absl::OkStatus();
  }
}

absl::StatusOr<SequenceInfo> KvStore::GetSequence(absl::string_view sequence_id) const {
  RETURN_IF_ERROR(CheckClientId("sequence_id", sequence_id));
  TsanVisibleLock lock(&mu_);
  const auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", QuoteId(sequence_id), " does not exist"));
  }
  const Sequence& s = *it->second;
  SequenceInfo info{s.id, s.prefix == nullptr ? "" : s.prefix->id, {}, s.kv_dtype};
  for (const Sequence::Layer& l : s.layers) info.lengths.push_back(l.length);
  return info;
}

// --- Decode ---------------------------------------------------------------------------------

absl::StatusOr<KvSnapshot> KvStore::Snapshot(absl::string_view sequence_id, int layer) {
  const std::string id(sequence_id);
  return Snapshot(std::span<const std::string>(&id, 1), layer);
}

absl::StatusOr<KvSnapshot> KvStore::Snapshot(std::span<const std::string> sequence_ids, int layer) {
  RETURN_IF_ERROR(CheckLayer(layer));
  if (sequence_ids.empty()) return absl::InvalidArgumentError("sequence_ids is empty");
  for (const std::string& id : sequence_ids) RETURN_IF_ERROR(CheckClientId("sequence_id", id));
  TsanVisibleLock lock(&mu_);
  std::vector<const Sequence*> found;
  for (const std::string& id : sequence_ids) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end()) {
      return absl::NotFoundError(absl::StrCat("sequence ", QuoteId(id), " does not exist"));
    }
    found.push_back(it->second.get());
  }
  std::vector<SequenceSnapshot> snapshots;
  std::vector<PrefixKey> pinned_prefixes;
  for (const Sequence* s : found) {
    const Sequence::Layer& l = s->layers[layer];
    SequenceSnapshot snapshot{s->id,       l.length, pool_.page_tokens(s->kv_dtype),
                              s->kv_dtype, l.pages,  {}};
    for (int32_t page : l.pages) pages_.Pin(page);
    if (s->prefix != nullptr) {
      tree_.AddReference(s->prefix);  // the chain above it is referenced through it
      pinned_prefixes.push_back(s->prefix->key);
      for (PrefixNode* node = s->prefix; node != nullptr; node = node->parent) {
        tree_.Touch(node);
        snapshot.prefixes.push_back(PrefixSpan{node->id, node->key, node->begin, node->end});
      }
      std::reverse(snapshot.prefixes.begin(), snapshot.prefixes.end());
    }
    snapshots.push_back(std::move(snapshot));
  }
  return KvSnapshot(this, layer, pool_.View(), pool_.Fp8View(), std::move(snapshots),
                    std::move(pinned_prefixes));
}

void KvStore::ReleaseSnapshot(std::span<const SequenceSnapshot> sequences,
                              std::span<const PrefixKey> prefixes) {
  TsanVisibleLock lock(&mu_);
  for (const SequenceSnapshot& s : sequences) {
    for (int32_t page : s.pages) pages_.Unpin(page);
  }
  for (PrefixKey key : prefixes) DropReference(tree_.nodes().at(key).get());
}

absl::StatusOr<ExpandedKv> KvStore::GetOrBuildExpanded(PrefixKey prefix, int layer,
                                                       const ModelWeights& weights) {
  RETURN_IF_ERROR(CheckLayer(layer));
  const ModelConfig& w = weights.config();
  if (w.heads != model_.heads || w.dn != model_.dn || w.dr != model_.dr || w.dl != model_.dl ||
      w.dv != model_.dv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights (", w.name, ": heads ", w.heads, ", dn ", w.dn, ", dr ", w.dr, ", dl ", w.dl,
        ", dv ", w.dv, ") do not match the store's model ", model_.name));
  }
  if (layer >= w.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is outside the weights' ", w.layers, " layers"));
  }

  PrefixNode* node = nullptr;
  ExpandedKvCache::Entry* entry = nullptr;
  std::vector<int32_t> pages;
  {
    TsanVisibleLock lock(&mu_);
    for (;;) {
      node = tree_.FindLive(prefix);
      if (node == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            "prefix key ", prefix, " does not exist (released and freed, or evicted)"));
      }
      entry = expanded_.Find(prefix, layer);
      if (entry == nullptr || entry->ready) break;
      TsanVisibleWait(published_, &mu_);  // being built by another call
    }
    if (entry != nullptr) {
      ++entry->pins;
      tree_.AddReference(node);
      tree_.Touch(node);
      entry->last_use = tree_.Tick();
      return ExpandedKv(this, prefix, layer, node->begin, entry->data.get());
    }
    const int64_t bytes =
        ExpandedKvData::Bytes(model_.heads, node->end - node->begin, model_.dqk(), model_.dv);
    tree_.AddReference(node);  // neither evictable while making room nor freed while building
    if (absl::Status s =
            Reserve(bytes, absl::StrCat("expanding prefix ", QuoteId(node->id), " layer ", layer));
        !s.ok()) {
      DropReference(node);
      return s;
    }
    entry = &expanded_.StartBuilding(prefix, layer, bytes);
    pages = node->pages[layer];
  }

  // Rows of a live prefix never change, so the expansion reads them without the lock.
  auto data = std::make_unique<ExpandedKvData>(
      node->kv_dtype == KvDtype::kFp8
          ? ExpandedKvData::BuildFromFp8(pool_.Fp8View(), pages, node->begin, node->end, model_.dr,
                                         weights.Layer(layer))
          : ExpandedKvData::Build(pool_.View(), pages, node->begin, node->end, model_.dr,
                                  weights.Layer(layer)));

  TsanVisibleLock lock(&mu_);
  expanded_.Publish(*entry, std::move(data), tree_.Tick());
  tree_.Touch(node);
  published_.SignalAll();
  return ExpandedKv(this, prefix, layer, node->begin, entry->data.get());
}

void KvStore::ReleaseExpanded(PrefixKey prefix, int layer) {
  TsanVisibleLock lock(&mu_);
  PrefixNode* node = tree_.nodes().at(prefix).get();
  --expanded_.Find(prefix, layer)->pins;
  DropReference(node);
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

// --- Restarts -------------------------------------------------------------------------------

KvCheckpoint KvStore::Checkpoint() {
  TsanVisibleLock lock(&mu_);
  KvStateManifest m;
  m.layers = model_.layers;
  m.dl = model_.dl;
  m.dr = model_.dr;
  m.page_size = pool_.page_size();
  std::vector<int32_t> pool_pages;
  absl::flat_hash_map<int32_t, int32_t> index_of_page;
  auto list = [&](KvDtype dtype, const std::vector<int32_t>& pages, int64_t length) {
    const int page_tokens = pool_.page_tokens(dtype);
    std::vector<int32_t> indices;
    indices.reserve(pages.size());
    for (size_t i = 0; i < pages.size(); ++i) {
      const auto tokens = static_cast<int32_t>(
          std::min<int64_t>(page_tokens, length - static_cast<int64_t>(i) * page_tokens));
      const auto [it, added] =
          index_of_page.try_emplace(pages[i], static_cast<int32_t>(pool_pages.size()));
      if (added) {
        pool_pages.push_back(pages[i]);
        m.pages.push_back({dtype, tokens});
        pages_.Pin(pages[i]);
      } else {
        m.pages[it->second].tokens = std::max(m.pages[it->second].tokens, tokens);
      }
      indices.push_back(it->second);
    }
    return indices;
  };

  // Keys grow with insertion and a child is inserted after its ready parent, so key order
  // puts parents first. A prefix still being registered is left out; nothing can reference
  // it yet.
  std::vector<const PrefixNode*> nodes;
  for (const auto& [key, node] : tree_.nodes()) {
    if (node->ready) nodes.push_back(node.get());
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const PrefixNode* a, const PrefixNode* b) { return a->key < b->key; });
  absl::flat_hash_map<PrefixKey, int32_t> index_of_prefix;
  for (const PrefixNode* node : nodes) {
    KvStateManifest::Prefix p;
    p.id = node->id;
    p.parent_id = node->parent_id;
    p.parent = node->parent == nullptr ? -1 : index_of_prefix.at(node->parent->key);
    p.begin = node->begin;
    p.end = node->end;
    p.kv_dtype = node->kv_dtype;
    p.registered = node->registered;
    for (const std::vector<int32_t>& pages : node->pages) {
      p.pages.push_back(list(node->kv_dtype, pages, node->end));
    }
    index_of_prefix.emplace(node->key, static_cast<int32_t>(m.prefixes.size()));
    m.prefixes.push_back(std::move(p));
  }
  for (const auto& [id, sequence] : sequences_) {
    KvStateManifest::Sequence s;
    s.id = sequence->id;
    s.forked = sequence->origin == Sequence::Origin::kForked;
    s.origin_id = sequence->origin_id;
    s.prefix = sequence->prefix == nullptr ? -1 : index_of_prefix.at(sequence->prefix->key);
    s.kv_dtype = sequence->kv_dtype;
    // An append in flight has not published: its layer is saved as it was before it.
    for (const Sequence::Layer& l : sequence->layers) {
      s.lengths.push_back(l.length);
      s.pages.push_back(list(sequence->kv_dtype, l.pages, l.length));
    }
    m.sequences.push_back(std::move(s));
  }
  return KvCheckpoint(this, std::move(m), std::move(pool_pages));
}

void KvStore::ReleaseCheckpoint(std::span<const int32_t> pages) {
  TsanVisibleLock lock(&mu_);
  for (int32_t page : pages) pages_.Unpin(page);
}

absl::Status KvStore::Restore(const KvStateManifest& m, KvStatePageReader read_page) {
  RETURN_IF_ERROR(CheckKvStateManifest(m, model_.layers, model_.dl, model_.dr,
                                       pool_.page_tokens(KvDtype::kBf16),
                                       pool_.page_tokens(KvDtype::kFp8)));
  // Who holds each page: it starts with its first holder, charged to that holder's tenant
  // (tenants share no pages), and gains the others.
  std::vector<std::vector<PageOwner>> holders(m.pages.size());
  std::vector<const std::string*> first_holder_id(m.pages.size(), nullptr);
  for (const KvStateManifest::Prefix& p : m.prefixes) {
    for (const auto& pages : p.pages) {
      for (int32_t index : pages) {
        holders[index].push_back(PageOwner::kPrefix);
        if (first_holder_id[index] == nullptr) first_holder_id[index] = &p.id;
      }
    }
  }
  for (const KvStateManifest::Sequence& s : m.sequences) {
    for (const auto& pages : s.pages) {
      for (int32_t index : pages) {
        holders[index].push_back(PageOwner::kSequence);
        if (first_holder_id[index] == nullptr) first_holder_id[index] = &s.id;
      }
    }
  }
  std::vector<int32_t> pool_pages(m.pages.size());
  {
    TsanVisibleLock lock(&mu_);
    if (!sequences_.empty() || !tree_.nodes().empty()) {
      return absl::FailedPreconditionError("a KV state is restored into an empty store only");
    }
    const int64_t bytes = static_cast<int64_t>(m.pages.size()) * pool_.page_bytes();
    if (UsedBytes() + bytes > budget_bytes_ ||
        static_cast<int64_t>(m.pages.size()) > pages_.num_free()) {
      return absl::ResourceExhaustedError(absl::StrCat("the state holds ", m.pages.size(),
                                                       " pages (", bytes, " bytes); the budget is ",
                                                       budget_bytes_, " bytes"));
    }
    for (size_t i = 0; i < m.pages.size(); ++i) {
      pool_pages[i] = pages_.Allocate(holders[i][0], AccountOf(*first_holder_id[i]));
      for (size_t h = 1; h < holders[i].size(); ++h) pages_.AddOwner(pool_pages[i], holders[i][h]);
    }
  }
  // The pages are in no list yet, so nothing reads them while they are filled.
  std::vector<std::byte> records;
  for (size_t i = 0; i < m.pages.size(); ++i) {
    const KvStateManifest::Page& page = m.pages[i];
    records.resize(
        static_cast<size_t>(page.tokens * KvStateRecordBytes(page.kv_dtype, m.dl, m.dr)));
    if (absl::Status read = read_page(static_cast<int32_t>(i), records); !read.ok()) {
      TsanVisibleLock lock(&mu_);
      for (size_t j = 0; j < m.pages.size(); ++j) {
        for (PageOwner holder : holders[j]) pages_.DropOwner(pool_pages[j], holder);
      }
      return read;
    }
    pool_.WriteRecords(page.kv_dtype, pool_pages[i], page.tokens, records.data());
  }

  TsanVisibleLock lock(&mu_);
  auto pool_list = [&pool_pages](const std::vector<int32_t>& indices) {
    std::vector<int32_t> pages;
    pages.reserve(indices.size());
    for (int32_t index : indices) pages.push_back(pool_pages[index]);
    return pages;
  };
  std::vector<PrefixNode*> nodes;
  for (const KvStateManifest::Prefix& p : m.prefixes) {
    auto node = std::make_unique<PrefixNode>();
    node->id = p.id;
    node->parent_id = p.parent_id;
    node->begin = p.begin;
    node->end = p.end;
    node->kv_dtype = p.kv_dtype;
    node->registered = p.registered;
    node->ready = true;
    for (const auto& pages : p.pages) node->pages.push_back(pool_list(pages));
    if (p.parent >= 0) {
      node->parent = nodes[p.parent];
      tree_.AddReference(node->parent);
    }
    nodes.push_back(tree_.Insert(std::move(node)));
    tree_.Touch(nodes.back());
  }
  for (const KvStateManifest::Sequence& s : m.sequences) {
    auto sequence = std::make_unique<Sequence>();
    sequence->id = s.id;
    sequence->origin = s.forked ? Sequence::Origin::kForked : Sequence::Origin::kCreated;
    sequence->origin_id = s.origin_id;
    sequence->kv_dtype = s.kv_dtype;
    if (s.prefix >= 0) {
      sequence->prefix = nodes[s.prefix];
      tree_.AddReference(sequence->prefix);
    }
    sequence->layers.resize(model_.layers);
    for (int layer = 0; layer < model_.layers; ++layer) {
      sequence->layers[layer].pages = pool_list(s.pages[layer]);
      sequence->layers[layer].length = s.lengths[layer];
    }
    sequences_.emplace(sequence->id, std::move(sequence));
  }
  return absl::OkStatus();
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
