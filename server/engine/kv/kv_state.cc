#include "server/engine/kv/kv_state.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/tiling.h"
#include "server/engine/kv/client_id.h"

namespace mlaserve::engine {
namespace {

struct Geometry {
  int layers;
  int bf16_page_tokens;
  int fp8_page_tokens;
  int page_tokens(KvDtype dtype) const {
    return dtype == KvDtype::kFp8 ? fp8_page_tokens : bf16_page_tokens;
  }
};

bool KnownDtype(KvDtype dtype) { return dtype == KvDtype::kBf16 || dtype == KvDtype::kFp8; }

// One page list of `owner` (its field name) covering tokens [0, length) in `dtype`.
absl::Status CheckPageList(const KvStateManifest& m, const Geometry& g, const std::string& owner,
                           KvDtype dtype, int64_t length, const std::vector<int32_t>& pages,
                           std::vector<int>& holders) {
  const int page_tokens = g.page_tokens(dtype);
  if (static_cast<int64_t>(pages.size()) != CeilDiv(length, page_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(owner, " has ", pages.size(), " pages for ",
                                                   length, " tokens of ", page_tokens, " a page"));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    const int32_t index = pages[i];
    if (index < 0 || index >= static_cast<int64_t>(m.pages.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(owner, " page ", i, " is page ", index, ", outside the saved pages"));
    }
    const KvStateManifest::Page& page = m.pages[index];
    const int64_t needed =
        std::min<int64_t>(page_tokens, length - static_cast<int64_t>(i) * page_tokens);
    if (page.kv_dtype != dtype || page.tokens < needed) {
      return absl::InvalidArgumentError(
          absl::StrCat(owner, " reads ", needed, " ", KvDtypeName(dtype), " tokens of pages[",
                       index, "], which holds ", page.tokens, " ", KvDtypeName(page.kv_dtype)));
    }
    ++holders[index];
  }
  return absl::OkStatus();
}

}  // namespace

int64_t KvStateManifest::tokens() const {
  int64_t total = 0;
  for (const Page& page : pages) total += page.tokens;
  return total;
}

int64_t KvStateRecordBytes(KvDtype kv_dtype, int dl, int dr) {
  return kv_dtype == KvDtype::kFp8 ? Fp8PageLayout::BytesPerToken(dl, dr)
                                   : static_cast<int64_t>(dl + dr) * 2;
}

absl::Status CheckKvStateManifest(const KvStateManifest& m, int layers, int dl, int dr,
                                  int bf16_page_tokens, int fp8_page_tokens) {
  if (m.layers != layers || m.dl != dl || m.dr != dr || m.page_size != bf16_page_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("the state is of ", m.layers, " layers, dl ", m.dl, ", dr ", m.dr, ", ",
                     m.page_size, "-token pages; this server has ", layers, " layers, dl ", dl,
                     ", dr ", dr, ", ", bf16_page_tokens, "-token pages"));
  }
  const Geometry g{layers, bf16_page_tokens, fp8_page_tokens};
  for (size_t i = 0; i < m.pages.size(); ++i) {
    const KvStateManifest::Page& page = m.pages[i];
    if (!KnownDtype(page.kv_dtype) || page.tokens < 1 ||
        page.tokens > g.page_tokens(page.kv_dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages[", i, "] holds ", page.tokens, " tokens, outside [1, a page]"));
    }
  }
  std::vector<int> holders(m.pages.size(), 0);
  std::vector<int> prefix_references(m.prefixes.size(), 0);
  absl::flat_hash_set<std::string> registered;
  for (size_t i = 0; i < m.prefixes.size(); ++i) {
    const KvStateManifest::Prefix& p = m.prefixes[i];
    const std::string field = absl::StrCat("prefixes[", i, "]");
    RETURN_IF_ERROR(CheckClientId(absl::StrCat(field, ".id"), p.id));
    if (!KnownDtype(p.kv_dtype)) return absl::InvalidArgumentError(field + " has no known format");
    if (p.registered && !registered.insert(p.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " registers ", QuoteId(p.id), " twice"));
    }
    if (p.parent < -1 || p.parent >= static_cast<int64_t>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".parent is ", p.parent, ", not an earlier prefix"));
    }
    if (p.parent >= 0) {
      const KvStateManifest::Prefix& parent = m.prefixes[p.parent];
      if (p.parent_id != parent.id || p.begin != parent.end || p.kv_dtype != parent.kv_dtype) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, " does not continue its parent prefixes[", p.parent, "]"));
      }
      ++prefix_references[p.parent];
    } else if (!p.parent_id.empty() || p.begin != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " names a parent but has none, or starts past token 0"));
    }
    if (p.end <= p.begin) {
      return absl::InvalidArgumentError(absl::StrCat(field, " holds no token"));
    }
    if (static_cast<int>(p.pages.size()) != layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " has ", p.pages.size(), " page lists for ", layers, " layers"));
    }
    for (int layer = 0; layer < layers; ++layer) {
      RETURN_IF_ERROR(CheckPageList(m, g, absl::StrCat(field, " layer ", layer), p.kv_dtype, p.end,
                                    p.pages[layer], holders));
    }
  }
  absl::flat_hash_set<std::string> sequence_ids;
  for (size_t i = 0; i < m.sequences.size(); ++i) {
    const KvStateManifest::Sequence& s = m.sequences[i];
    const std::string field = absl::StrCat("sequences[", i, "]");
    RETURN_IF_ERROR(CheckClientId(absl::StrCat(field, ".id"), s.id));
    if (!sequence_ids.insert(s.id).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, " repeats ", QuoteId(s.id)));
    }
    if (!s.origin_id.empty()) RETURN_IF_ERROR(CheckClientId(field + ".origin_id", s.origin_id));
    if (s.forked && s.origin_id.empty()) {
      return absl::InvalidArgumentError(field + " is a fork of no sequence");
    }
    if (!KnownDtype(s.kv_dtype)) return absl::InvalidArgumentError(field + " has no known format");
    if (s.prefix < -1 || s.prefix >= static_cast<int64_t>(m.prefixes.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".prefix is ", s.prefix, ", outside the saved prefixes"));
    }
    const KvStateManifest::Prefix* prefix = s.prefix >= 0 ? &m.prefixes[s.prefix] : nullptr;
    if (prefix != nullptr) {
      ++prefix_references[s.prefix];
      if (prefix->kv_dtype != s.kv_dtype) {
        return absl::InvalidArgumentError(field + " is not in its prefix's format");
      }
    }
    if (static_cast<int>(s.lengths.size()) != layers ||
        static_cast<int>(s.pages.size()) != layers) {
      return absl::InvalidArgumentError(absl::StrCat(field, " has ", s.lengths.size(),
                                                     " lengths and ", s.pages.size(),
                                                     " page lists for ", layers, " layers"));
    }
    for (int layer = 0; layer < layers; ++layer) {
      const std::string owner = absl::StrCat(field, " layer ", layer);
      if (s.lengths[layer] < 0 || (prefix != nullptr && s.lengths[layer] < prefix->end)) {
        return absl::InvalidArgumentError(
            absl::StrCat(owner, " holds ", s.lengths[layer], " tokens, fewer than its prefix"));
      }
      RETURN_IF_ERROR(
          CheckPageList(m, g, owner, s.kv_dtype, s.lengths[layer], s.pages[layer], holders));
      // The batcher serves a sequence's first prefix->end tokens from the prefix's pages
      // (TyphoonMLA's shared part): its own list must hold those very pages. A partly filled
      // last prefix page may be a copy (copy-on-write), which holds the same rows.
      if (prefix != nullptr) {
        const int64_t shared = prefix->end / g.page_tokens(s.kv_dtype);
        if (!std::equal(prefix->pages[layer].begin(), prefix->pages[layer].begin() + shared,
                        s.pages[layer].begin())) {
          return absl::InvalidArgumentError(
              absl::StrCat(owner, " does not start with its prefix's pages"));
        }
      }
    }
  }
  for (size_t i = 0; i < m.pages.size(); ++i) {
    if (holders[i] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("pages[", i, "] is in no page list"));
    }
  }
  for (size_t i = 0; i < m.prefixes.size(); ++i) {
    if (!m.prefixes[i].registered && prefix_references[i] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefixes[", i, "] is released and nothing references it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::engine
