#include "server/engine/kv/page_allocator.h"

#include <cstring>

#include "gtest/gtest.h"
#include "kernels/core/fp8_latent_row.h"
#include "kernels/core/random_fill.h"
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

TEST(PageAllocatorTest, CountsPagesTouchedOnlyWhenMoreAreInUseThanEver) {
  PageAllocator pages(8);
  EXPECT_EQ(pages.num_touched(), 0);
  const int32_t a = pages.Allocate(PageOwner::kSequence);
  const int32_t b = pages.Allocate(PageOwner::kSequence);
  EXPECT_EQ(pages.num_touched(), 2);
  // Churn at two pages in use reuses the freed pages: nothing more becomes resident.
  for (int round = 0; round < 10; ++round) {
    EXPECT_TRUE(pages.DropOwner(round % 2 == 0 ? a : b, PageOwner::kSequence));
    pages.Allocate(PageOwner::kSequence);
  }
  EXPECT_EQ(pages.num_touched(), 2);
  pages.Allocate(PageOwner::kPrefix);  // a third at once: one more page written
  EXPECT_EQ(pages.num_touched(), 3);
  EXPECT_EQ(pages.num_free(), 5);
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
  // Rows of dl 4 + dr 0 values; a 2-token bf16 page (16 bytes) holds two 8-byte FP8 tokens.
  absl::StatusOr<PagePool> pool = PagePool::Create(4, 2, 4, 0);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->page_bytes(), 2 * 4 * 2);
  EXPECT_EQ(pool->page_tokens(KvDtype::kFp8), 2);
  std::vector<Bf16> rows(3 * 4);
  for (int i = 0; i < 12; ++i) rows[i] = Bf16::FromFloat(static_cast<float>(i + 1));
  const std::vector<int32_t> table = {3, 1};
  // Tokens 1..3: page 3 row 1, page 1 rows 0-1.
  pool->WriteTokens(KvDtype::kBf16, table, 1, rows.data(), 4, 3);
  const PagedKvCache view = pool->View();
  EXPECT_EQ(view.pages(3, 1, 0).ToFloat(), 1.0f);
  EXPECT_EQ(view.pages(1, 0, 3).ToFloat(), 8.0f);
  EXPECT_EQ(view.pages(1, 1, 3).ToFloat(), 12.0f);
  EXPECT_TRUE(pool->HoldsRows(KvDtype::kBf16, table, 1, rows.data(), 4, 3));
  rows[5] = Bf16::FromFloat(-1.0f);
  EXPECT_FALSE(pool->HoldsRows(KvDtype::kBf16, table, 1, rows.data(), 4, 3));

  pool->CopyRows(KvDtype::kBf16, 1, 2, 1);
  EXPECT_EQ(view.pages(2, 0, 0).ToFloat(), 5.0f);
  EXPECT_EQ(view.pages(2, 1, 0).ToFloat(), 0.0f);  // untouched: fresh mappings read zero

  EXPECT_EQ(PagePool::Create(0, 2, 4, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagePool::Create(4, 2, 3, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PagePoolTest, Fp8PagesFillTheSameSlotsWithMoreTokens) {
  // DeepSeek's rows in 128-token bf16 slots: 228 FP8 tokens of 644 bytes each.
  absl::StatusOr<PagePool> pool = PagePool::Create(3, 128, 512, 64);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->page_tokens(KvDtype::kFp8), 228);
  EXPECT_EQ(pool->fp8_layout().stride(), pool->page_bytes());
  std::vector<Bf16> rows(300 * 576);
  Rng rng(7);
  FillNormal(rows, 1.0, rng);
  const std::vector<int32_t> table = {2, 0};
  pool->WriteTokens(KvDtype::kFp8, table, 5, rows.data(), 576, 300);  // crosses a page
  EXPECT_TRUE(pool->HoldsRows(KvDtype::kFp8, table, 5, rows.data(), 576, 300));
  const Fp8PagedKvCache fp8 = pool->Fp8View();
  std::vector<Fp8E4m3> content(512);
  std::vector<Bf16> rope(64);
  for (int r : {0, 222, 223, 299}) {
    const int64_t token = 5 + r;
    const int page = table[token / 228], row = static_cast<int>(token % 228);
    float scale = 0;
    QuantizeLatentRow(rows.data() + int64_t{r} * 576, 512, 64,
                      Fp8LatentRow{content.data(), &scale, rope.data()});
    EXPECT_EQ(fp8.scale(page, row), scale) << r;
    EXPECT_EQ(std::memcmp(fp8.content(page, row), content.data(), 512), 0) << r;
    EXPECT_EQ(std::memcmp(fp8.rope(page, row), rope.data(), 128), 0) << r;
  }
  // Records in the wire's FP8 form land in the same places.
  std::vector<std::byte> record(644);
  std::memcpy(record.data(), fp8.content(2, 10), 512);
  const float scale = fp8.scale(2, 10);
  std::memcpy(record.data() + 512, &scale, 4);
  std::memcpy(record.data() + 516, fp8.rope(2, 10), 128);
  const std::vector<int32_t> other = {1};
  pool->WriteFp8Records(other, 7, record.data(), 1);
  EXPECT_EQ(fp8.scale(1, 7), scale);
  EXPECT_EQ(std::memcmp(fp8.content(1, 7), fp8.content(2, 10), 512), 0);
  EXPECT_EQ(std::memcmp(fp8.rope(1, 7), fp8.rope(2, 10), 128), 0);
  // Copy-on-write of an FP8 page copies each section's first rows.
  pool->CopyRows(KvDtype::kFp8, 2, 1, 20);
  EXPECT_EQ(fp8.scale(1, 19), fp8.scale(2, 19));
  EXPECT_EQ(std::memcmp(fp8.content(1, 19), fp8.content(2, 19), 512), 0);
  EXPECT_EQ(fp8.scale(1, 20), 0.0f);
}

}  // namespace
}  // namespace mlaserve::engine
