#include "server/engine/kv/kv_store.h"

// KvStore's sequences: create, fork, append (reserve, copy outside the lock, publish),
// release and lookup.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// An append between its reservation and its publication.
struct KvStore::AppendReservation {
  Sequence* sequence = nullptr;  // cannot go away: release waits for the append
  int layer = 0;
  int64_t first_token = 0;
  int64_t rows = 0;
  // The append's leading rows already stored (a retry straddling the end): its rows
  // [skip, skip + rows) are the ones written, from first_token on.
  int64_t skip = 0;
  // The pages the rows land in: the current last page (or its copy) if it has room, then
  // the new ones. Token first_token sits at row first_token % page_size of targets[0].
  std::vector<int32_t> targets;
  int32_t cow_source = -1;  // the shared last page copied into targets[0], or -1
  int cow_rows = 0;
  KvDtype kv_dtype = KvDtype::kBf16;  // the sequence's
};

bool KvStore::Appending(const Sequence& sequence) {
  return std::any_of(sequence.layers.begin(), sequence.layers.end(),
                     [](const Sequence::Layer& l) { return l.appending; });
}

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

  ASSIGN_OR_RETURN(
      std::optional<AppendReservation> reservation,
      ReserveAppend(sequence_id, layer, start_position, rows.dim(0), /*fp8_records=*/false,
                    [&](KvDtype dtype, std::span<const int32_t> pages, int64_t token, int64_t row0,
                        int64_t n) -> std::optional<int64_t> {
                      const std::optional<int64_t> r = pool_.FirstDifferingRow(
                          dtype, pages, token, rows.row(row0), rows.stride(0), n);
                      if (!r) return std::nullopt;
                      return row0 + *r;
                    }));
  if (!reservation.has_value()) return absl::OkStatus();
  const KvDtype dtype = reservation->kv_dtype;
  if (reservation->cow_source >= 0) {
    pool_.CopyRows(dtype, reservation->cow_source, reservation->targets[0], reservation->cow_rows);
  }
  pool_.WriteTokens(dtype, reservation->targets,
                    reservation->first_token % pool_.page_tokens(dtype),
                    rows.row(reservation->skip), rows.stride(0), reservation->rows);
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
                   ReserveAppend(sequence_id, layer, start_position, n, /*fp8_records=*/true,
                                 [&](KvDtype, std::span<const int32_t> pages, int64_t token,
                                     int64_t row0, int64_t count) -> std::optional<int64_t> {
                                   const std::optional<int64_t> r = pool_.FirstDifferingFp8Record(
                                       pages, token, records.data() + row0 * record, count);
                                   if (!r) return std::nullopt;
                                   return row0 + *r;
                                 }));
  if (!reservation.has_value()) return absl::OkStatus();
  if (reservation->cow_source >= 0) {
    pool_.CopyRows(KvDtype::kFp8, reservation->cow_source, reservation->targets[0],
                   reservation->cow_rows);
  }
  pool_.WriteFp8Records(reservation->targets, reservation->first_token % layout.page_size,
                        records.data() + reservation->skip * record, reservation->rows);
  PublishAppend(*reservation);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<KvStore::AppendReservation>> KvStore::ReserveAppend(
    absl::string_view sequence_id, int layer, int64_t start_position, int64_t rows,
    bool fp8_records, StoredRowsCheck first_difference) {
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
  if (start_position > l.length) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", QuoteId(sequence_id), " layer ", layer, " holds ", l.length,
                     " tokens: an append must start at position ", l.length,
                     " (or retry an earlier range), not ", start_position));
  }
  // Rows over tokens already stored: a retry only if they are the rows stored (a client told
  // OK for other rows would decode against values it never sent).
  const int64_t stored = std::min<int64_t>(rows, l.length - start_position);
  if (stored > 0) {
    const std::optional<int64_t> differs =
        first_difference(sequence->kv_dtype, l.pages, start_position, 0, stored);
    if (differs.has_value()) {
      return absl::AlreadyExistsError(
          absl::StrCat("sequence ", QuoteId(sequence_id), " layer ", layer, " already holds token ",
                       start_position + *differs, " with other values than rows[", *differs,
                       "]: a retry must resend the rows it sent (tokens ", start_position, " to ",
                       l.length - 1, " are stored); nothing was appended"));
    }
    if (stored == rows) return std::nullopt;
  }
  const int64_t fresh = rows - stored;
  if (l.length + fresh > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", QuoteId(sequence_id), " layer ",
                                                   layer, " would hold ", l.length + fresh,
                                                   " tokens, past 2^31 - 1"));
  }
  const int page_size = pool_.page_tokens(sequence->kv_dtype);
  const int cow_rows = l.length % page_size;
  // A partly filled last page that another list holds must be copied before it is written.
  const bool copy_last = cow_rows != 0 && pages_.owners(l.pages.back()) > 1;
  const int64_t new_pages =
      CeilDiv(l.length + fresh, page_size) - CeilDiv(l.length, page_size) + (copy_last ? 1 : 0);
  const int32_t account = AccountOf(sequence_id);
  RETURN_IF_ERROR(Reserve(new_pages * pool_.page_bytes(),
                          absl::StrCat("appending ", fresh, " tokens to sequence ",
                                       QuoteId(sequence_id), " layer ", layer),
                          account));

  AppendReservation r;
  r.sequence = sequence;
  r.kv_dtype = sequence->kv_dtype;
  r.layer = layer;
  r.first_token = l.length;
  r.rows = fresh;
  r.skip = stored;
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

}  // namespace mlaserve::engine
