#ifndef MLASERVE_SERVER_ENGINE_KV_PAGE_ALLOCATOR_H_
#define MLASERVE_SERVER_ENGINE_KV_PAGE_ALLOCATOR_H_

#include <array>
#include <cstdint>
#include <vector>

namespace mlaserve::engine {

// Who holds a page in its page list. Prefix and sequence owners are counted apart only for
// the statistics; both make a page shared (copy before writing) once there are two.
enum class PageOwner { kPrefix, kSequence };

// Pages of a pool by what keeps them alive.
struct PageCounts {
  int32_t free = 0;
  int32_t prefix = 0;    // in at least one prefix's page list (maybe in sequences' too)
  int32_t sequence = 0;  // in sequences' page lists only
  int32_t pinned = 0;    // in no page list any more, kept alive by a snapshot

  friend bool operator==(const PageCounts&, const PageCounts&) = default;
};

// Which pages of a pool are in use and by whom. A page has owners (page lists that contain
// it) and pins (snapshots reading it); it returns to the free list when both reach zero.
// Ownership decides copy-on-write: a page with more than one owner is never written. Pins do
// not: a pinned page may still be appended to by its single owner, because a snapshot reads
// only rows below the length it captured.
//
// Not thread-safe: the owner serialises calls (KvStore holds its mutex).
class PageAllocator {
 public:
  explicit PageAllocator(int32_t num_pages);

  int32_t num_pages() const { return static_cast<int32_t>(refs_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_list_.size()); }
  // Pages handed out at least once. The pool keeps a written page resident (PagePool), so
  // this, not the pages in use, is what the KV cache costs in RAM; with the most recently
  // freed page reused first it grows only when more pages are in use at once than ever.
  int32_t num_touched() const { return touched_; }
  PageCounts counts() const;

  // Takes a free page, which starts with one owner of `kind`, charged to `account` (a
  // tenant's namespace, 0 for none) until it is free again. Precondition: num_free() > 0.
  // Pages come out lowest id first from a fresh allocator, most recently freed first after.
  int32_t Allocate(PageOwner kind, int32_t account = 0);
  // Pages in use charged to `account`.
  int32_t account_pages(int32_t account) const {
    return account < static_cast<int32_t>(account_pages_.size()) ? account_pages_[account] : 0;
  }

  void AddOwner(int32_t page, PageOwner kind);
  // Returns true if the page became free.
  bool DropOwner(int32_t page, PageOwner kind);

  void Pin(int32_t page);
  // Returns true if the page became free.
  bool Unpin(int32_t page);

  // Owners of either kind: more than one means the page is shared and must not be written.
  int32_t owners(int32_t page) const {
    return refs_[page].prefix_owners + refs_[page].sequence_owners;
  }
  int32_t pins(int32_t page) const { return refs_[page].pins; }

 private:
  struct Refs {
    int32_t prefix_owners = 0;
    int32_t sequence_owners = 0;
    int32_t pins = 0;
    int32_t account = 0;
    bool touched = false;
  };
  enum Kind { kFree, kPrefix, kSequence, kPinned, kNumKinds };

  static Kind KindOf(const Refs& r);
  // Applies `change` to a page's counts, keeping the per-kind totals and the free list right.
  template <typename Change>
  bool Update(int32_t page, Change change);

  std::vector<Refs> refs_;
  std::vector<int32_t> free_list_;  // a stack
  std::array<int32_t, kNumKinds> kind_counts_{};
  std::vector<int32_t> account_pages_;  // [account] pages in use
  int32_t touched_ = 0;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_PAGE_ALLOCATOR_H_
