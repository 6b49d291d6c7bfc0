#include "server/engine/kv/page_write_log.h"

#include <algorithm>
#include <utility>

namespace mlaserve::engine {

void PageWriteLog::Written(int32_t page, int64_t begin, int64_t end) {
  if (end <= begin) return;
  const int64_t first = begin / alignment_ * alignment_;
  const int64_t last = (end + alignment_ - 1) / alignment_ * alignment_;
  std::lock_guard lock(mu_);
  pending_.push_back(Range{page, first, last});
}

std::vector<PageWriteLog::Range> PageWriteLog::Drain() {
  std::vector<Range> ranges;
  {
    std::lock_guard lock(mu_);
    ranges.swap(pending_);
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.page != b.page ? a.page < b.page : a.begin < b.begin;
  });
  std::vector<Range> merged;
  for (const Range& r : ranges) {
    if (!merged.empty() && merged.back().page == r.page && r.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

void PageWriteLog::Restore(const std::vector<Range>& ranges) {
  std::lock_guard lock(mu_);
  pending_.insert(pending_.end(), ranges.begin(), ranges.end());
}

}  // namespace mlaserve::engine
