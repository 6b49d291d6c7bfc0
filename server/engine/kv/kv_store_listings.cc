#include "server/engine/kv/kv_store.h"

// KvStore's admin listings of prefixes and sequences, a page of ids at a time.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "server/engine/kv/kv_store_internal.h"
#include "server/engine/kv/tsan_visible_lock.h"

namespace mlaserve::engine {
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

}  // namespace mlaserve::engine
