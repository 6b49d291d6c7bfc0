#include "server/engine/kv/kv_store.h"

// KvStore's restarts: a checkpoint of everything it holds, and the restore of one into an
// empty store (kv_state.h).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/kv/kv_state.h"
#include "server/engine/kv/kv_store_internal.h"
#include "server/engine/kv/tsan_visible_lock.h"

namespace mlaserve::engine {

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

}  // namespace mlaserve::engine
