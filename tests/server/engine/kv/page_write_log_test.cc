#include "server/engine/kv/page_write_log.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/kv/page_pool.h"

namespace mlaserve::engine {
namespace {

using Range = PageWriteLog::Range;
using ::testing::ElementsAre;

TEST(PageWriteLogTest, RangesWidenToTheAlignmentAndMergePerPage) {
  PageWriteLog log(16);
  log.Written(3, 20, 30);  // -> [16, 32)
  log.Written(1, 0, 1152);
  log.Written(3, 32, 40);  // touches [16, 32): merged -> [16, 48)
  log.Written(1, 2304, 3456);
  log.Written(3, 100, 100);  // empty: nothing
  EXPECT_THAT(log.Drain(), ElementsAre(Range{1, 0, 1152}, Range{1, 2304, 3456}, Range{3, 16, 48}));
  EXPECT_TRUE(log.Drain().empty());
  log.Restore({Range{2, 0, 16}});
  EXPECT_THAT(log.Drain(), ElementsAre(Range{2, 0, 16}));
}

// The pool tells its listener every byte range it writes: bf16 rows as whole rows, FP8
// tokens as their three sections (content, scale, RoPE), copy-on-write copies, restores.
TEST(PageWriteLogTest, ThePoolReportsEveryWrite) {
  auto log = std::make_shared<PageWriteLog>(1);
  auto pool = PagePool::Create(8, 16, 512, 64, log);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const int64_t row = 576 * 2;
  std::vector<Bf16> rows(3 * 576, Bf16::FromFloat(0.5f));
  const std::vector<int32_t> pages = {5, 2};
  pool->WriteTokens(KvDtype::kBf16, pages, 15, rows.data(), 576,
                    3);  // page 5 row 15, page 2 rows 0-1
  EXPECT_THAT(log->Drain(), ElementsAre(Range{2, 0, 2 * row}, Range{5, 15 * row, 16 * row}));

  pool->CopyRows(KvDtype::kBf16, 5, 6, 4);
  EXPECT_THAT(log->Drain(), ElementsAre(Range{6, 0, 4 * row}));

  const Fp8PageLayout& l = pool->fp8_layout();
  const std::vector<int32_t> fp8_pages = {7};
  pool->WriteTokens(KvDtype::kFp8, fp8_pages, 4, rows.data(), 576, 2);
  EXPECT_THAT(log->Drain(), ElementsAre(Range{7, l.content_offset(4), l.content_offset(6)},
                                        Range{7, l.scale_offset(4), l.scale_offset(6)},
                                        Range{7, l.rope_offset(4), l.rope_offset(6)}));
}

}  // namespace
}  // namespace mlaserve::engine
