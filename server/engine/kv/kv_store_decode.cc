#include "server/engine/kv/kv_store.h"

// KvStore's side of decode: snapshots of sequences and the expanded K/V of prefixes, each
// pinning what it reads until its handle goes.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/kv/client_id.h"
#include "server/engine/kv/expansion_builder.h"
#include "server/engine/kv/kv_store_internal.h"
#include "server/engine/kv/tsan_visible_lock.h"

namespace mlaserve::engine {

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
  absl::StatusOr<std::unique_ptr<ExpandedKvData>> data;
  if (expansions_ != nullptr) {
    data =
        expansions_->Build(pool_, {node->kv_dtype, pages, node->begin, node->end, layer}, weights);
  } else {
    data = std::make_unique<ExpandedKvData>(
        node->kv_dtype == KvDtype::kFp8
            ? ExpandedKvData::BuildFromFp8(pool_.Fp8View(), pages, node->begin, node->end,
                                           model_.dr, weights.Layer(layer))
            : ExpandedKvData::Build(pool_.View(), pages, node->begin, node->end, model_.dr,
                                    weights.Layer(layer)));
  }

  TsanVisibleLock lock(&mu_);
  if (!data.ok()) {
    // Nothing was kept: the entry and its bytes go, waiters find no entry and try themselves.
    expanded_.Free(prefix, layer);
    DropReference(node);
    published_.SignalAll();
    return data.status();
  }
  expanded_.Publish(*entry, *std::move(data), tree_.Tick());
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

}  // namespace mlaserve::engine
