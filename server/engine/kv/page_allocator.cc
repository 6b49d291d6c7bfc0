#include "server/engine/kv/page_allocator.h"

namespace mlaserve::engine {

PageAllocator::PageAllocator(int32_t num_pages) : refs_(num_pages) {
  free_list_.reserve(num_pages);
  for (int32_t page = num_pages - 1; page >= 0; --page) free_list_.push_back(page);
  kind_counts_[kFree] = num_pages;
}

PageCounts PageAllocator::counts() const {
  return PageCounts{kind_counts_[kFree], kind_counts_[kPrefix], kind_counts_[kSequence],
                    kind_counts_[kPinned]};
}

PageAllocator::Kind PageAllocator::KindOf(const Refs& r) {
  if (r.prefix_owners > 0) return kPrefix;
  if (r.sequence_owners > 0) return kSequence;
  if (r.pins > 0) return kPinned;
  return kFree;
}

template <typename Change>
bool PageAllocator::Update(int32_t page, Change change) {
  Refs& r = refs_[page];
  const Kind before = KindOf(r);
  change(r);
  const Kind after = KindOf(r);
  --kind_counts_[before];
  ++kind_counts_[after];
  if (after == kFree && before != kFree) {
    free_list_.push_back(page);
    --account_pages_[r.account];
    return true;
  }
  return false;
}

int32_t PageAllocator::Allocate(PageOwner kind, int32_t account) {
  const int32_t page = free_list_.back();
  free_list_.pop_back();
  if (account >= static_cast<int32_t>(account_pages_.size())) account_pages_.resize(account + 1);
  refs_[page].account = account;
  if (!refs_[page].touched) {
    refs_[page].touched = true;
    ++touched_;
  }
  ++account_pages_[account];
  AddOwner(page, kind);
  return page;
}

void PageAllocator::AddOwner(int32_t page, PageOwner kind) {
  Update(page,
         [kind](Refs& r) { ++(kind == PageOwner::kPrefix ? r.prefix_owners : r.sequence_owners); });
}

bool PageAllocator::DropOwner(int32_t page, PageOwner kind) {
  return Update(page, [kind](Refs& r) {
    --(kind == PageOwner::kPrefix ? r.prefix_owners : r.sequence_owners);
  });
}

void PageAllocator::Pin(int32_t page) {
  Update(page, [](Refs& r) { ++r.pins; });
}

bool PageAllocator::Unpin(int32_t page) {
  return Update(page, [](Refs& r) { --r.pins; });
}

}  // namespace mlaserve::engine
