#include "server/engine/kv/page_allocator.h"

#include "gtest/gtest.h"
#include "server/engine/kv/page_pool.h"

namespace mlaserve::engine {
namespace {

TEST(PageAllocatorTest, HandsOutLowPagesFirstAndReusesTheLastFreed) {
  PageAllocator pages(4);
  EXPECT_EQ(pages.Allocate(PageOwner::kSequence), 0);
  EXPECT_EQ(pages.Allocate(PageOwner::kSequence), 1);
  EXPECT_EQ(pages.num_free(), 2);
  EXPECT_TRUE(pages.DropOwner(0, PageOwner::kSequence));
  EXPECT_EQ(pages.Allocate(PageOwner::kPrefix), 0);
}

TEST(PageAllocatorTest, ClassifiesPagesByWhatKeepsThemAlive) {
  PageAllocator pages(3);
  const int32_t page = pages.Allocate(PageOwner::kPrefix);
  pages.AddOwner(page, PageOwner::kSequence);
  EXPECT_EQ(pages.counts(), (PageCounts{.free = 2, .prefix = 1}));
  EXPECT_EQ(pages.owners(page), 2);

  EXPECT_FALSE(pages.DropOwner(page, PageOwner::kPrefix));
  EXPECT_EQ(pages.counts(), (PageCounts{.free = 2, .sequence = 1}));

  pages.Pin(page);
  EXPECT_FALSE(pages.DropOwner(page, PageOwner::kSequence));
  EXPECT_EQ(pages.counts(), (PageCounts{.free = 2, .pinned = 1}));
  EXPECT_EQ(pages.owners(page), 0);
  EXPECT_EQ(pages.pins(page), 1);

  EXPECT_TRUE(pages.Unpin(page));
  EXPECT_EQ(pages.counts(), (PageCounts{.free = 3}));
  EXPECT_EQ(pages.num_free(), 3);
}

TEST(PagePoolTest, WritesTokensThroughABlockTableAndCopiesPagePrefixes) {
  absl::StatusOr<PagePool> pool = PagePool::Create(4, 2, 3);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->page_bytes(), 2 * 3 * 2);
  std::vector<Bf16> rows(3 * 3);
  for (int i = 0; i < 9; ++i) rows[i] = Bf16::FromFloat(static_cast<float>(i + 1));
  const std::vector<int32_t> table = {3, 1};
  pool->WriteTokens(table, 1, rows.data(), 3, 3);  // tokens 1..3: page 3 row 1, page 1 rows 0-1
  const PagedKvCache view = pool->View();
  EXPECT_EQ(view.pages(3, 1, 0).ToFloat(), 1.0f);
  EXPECT_EQ(view.pages(1, 0, 2).ToFloat(), 6.0f);
  EXPECT_EQ(view.pages(1, 1, 2).ToFloat(), 9.0f);

  pool->CopyRows(1, 2, 1);
  EXPECT_EQ(view.pages(2, 0, 0).ToFloat(), 4.0f);
  EXPECT_EQ(view.pages(2, 1, 0).ToFloat(), 0.0f);  // untouched: fresh mappings read zero

  EXPECT_EQ(PagePool::Create(0, 2, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mlaserve::engine
