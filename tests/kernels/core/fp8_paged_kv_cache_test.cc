#include "kernels/core/fp8_paged_kv_cache.h"

#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/random_fill.h"

namespace mlaserve {
namespace {

TEST(Fp8PageLayoutTest, SectionsSitWhereTheDocsSay) {
  const Fp8PageLayout layout{64, 512, 64};
  EXPECT_EQ(Fp8PageLayout::BytesPerToken(512, 64), 644);
  EXPECT_EQ(layout.page_bytes(), 64 * 644);
  EXPECT_EQ(layout.content_offset(5), 5 * 512);
  EXPECT_EQ(layout.scale_offset(0), 64 * 512);
  EXPECT_EQ(layout.scale_offset(5), 64 * 512 + 20);
  EXPECT_EQ(layout.rope_offset(0), 64 * 516);
  EXPECT_EQ(layout.rope_offset(63) + 128, layout.page_bytes());
}

TEST(Fp8PagedKvCacheTest, SequenceKeysWidenAcrossShuffledPages) {
  constexpr int kPageSize = 16, kNarrowDl = 64, kNarrowDr = 8, kPages = 5;
  Rng rng(std::random_device{}());
  std::vector<Bf16> rows(static_cast<size_t>(kPages) * kPageSize * (kNarrowDl + kNarrowDr));
  FillNormal(rows, 2.0, rng);
  auto view =
      TensorView<const Bf16, 3>::Create(rows, {kPages, kPageSize, kNarrowDl + kNarrowDr}, "rows");
  ASSERT_TRUE(view.ok());
  const std::vector<std::byte> bytes = QuantizePagedCache(PagedKvCache{*view}, kNarrowDl);
  const Fp8PagedKvCache cache{bytes.data(), kPages, Fp8PageLayout{kPageSize, kNarrowDl, kNarrowDr}};
  ASSERT_EQ(bytes.size(), static_cast<size_t>(kPages * cache.layout.page_bytes()));

  const std::vector<int32_t> pages = {3, 0, 4, 1};  // token order
  const Fp8SequenceKeys keys{cache, pages, /*first_token=*/7, /*length=*/50};
  std::vector<Bf16> widened(static_cast<size_t>(20) * (kNarrowDl + kNarrowDr));
  std::vector<float> scales(20);
  keys.Widen(/*begin=*/5, /*count=*/20, widened.data(), kNarrowDl + kNarrowDr, scales.data());
  for (int t = 0; t < 20; ++t) {
    const int token = 7 + 5 + t;
    const int page = pages[token / kPageSize], row = token % kPageSize;
    const Bf16* source = view->row(page, row);
    float scale = 0;
    std::vector<Fp8E4m3> content(kNarrowDl);
    std::vector<Bf16> rope(kNarrowDr);
    QuantizeLatentRow(source, kNarrowDl, kNarrowDr,
                      Fp8LatentRow{content.data(), &scale, rope.data()});
    ASSERT_EQ(scales[t], scale) << t;
    ASSERT_EQ(cache.scale(page, row), scale) << t;
    for (int c = 0; c < kNarrowDl; ++c) {
      ASSERT_EQ(widened[t * (kNarrowDl + kNarrowDr) + c], content[c].ToBf16()) << t << "," << c;
    }
    for (int c = 0; c < kNarrowDr; ++c)
      ASSERT_EQ(widened[t * (kNarrowDl + kNarrowDr) + kNarrowDl + c], rope[c]);
  }
}

TEST(Fp8PagedKvCacheTest, ValidationNamesWhatIsWrong) {
  const std::vector<int32_t> table = {0, 7};
  const std::vector<int32_t> seqlens = {20};
  auto table_view = TensorView<const int32_t, 2>::Create(table, {1, 2}, "block_table");
  ASSERT_TRUE(table_view.ok());
  const PagedSequences seqs{*table_view, seqlens};
  Fp8PagedKvCache cache{nullptr, 4, Fp8PageLayout{16, 512, 64}};
  const absl::Status bad_page = ValidateFp8PagedDecode(0.1f, 1, cache, seqs);
  EXPECT_EQ(bad_page.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_page.message().find("block_table[0][1]"), std::string::npos) << bad_page;
  cache.layout.dl = 510;
  EXPECT_NE(ValidateFp8PagedDecode(0.1f, 1, cache, seqs).message().find("dl"), std::string::npos);
}

}  // namespace
}  // namespace mlaserve
