// KvStore's budget: eviction of unreferenced prefixes, least recently used first, and
// operations that cannot fit changing nothing.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/kv/kv_store.h"
#include "tests/server/engine/kv/kv_store_fixture.h"
#include "tests/server/engine/kv/kv_store_test_util.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::kPageSize;
using ::mlaserve::engine::testing::kStorePageBytes;
using ::mlaserve::engine::testing::KvStoreTest;
using ::mlaserve::engine::testing::kWidth;
using ::mlaserve::engine::testing::Latent;
using ::mlaserve::engine::testing::Rows;
using ::mlaserve::engine::testing::View2;
using ::testing::HasSubstr;

TEST_F(KvStoreTest, EvictsLeastRecentlyUsedUnreferencedPrefixesOnly) {
  MakeStore(/*pages=*/9, /*layers=*/1);
  // Three one-layer prefixes of 3 pages each fill the budget.
  for (const char* id : {"p1", "p2", "p3"}) {
    const Latent latent(id[1], 1, 0, 12, kWidth);
    ASSERT_TRUE(store_->RegisterPrefix(id, "", latent.View()).ok());
  }
  ASSERT_TRUE(store_->CreateSequence("holds-p2", "p2").ok());  // p2 is referenced
  ASSERT_TRUE(store_->CreateSequence("touch", "p1").ok());     // p1 used after p3
  ASSERT_TRUE(store_->ReleaseSequence("touch").ok());

  // Needs 3 pages: p3 is the least recently used unreferenced prefix.
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  Append("s", 0, 0, 12, 1);
  EXPECT_EQ(store_->GetPrefix("p3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->GetPrefix("p1").ok());
  EXPECT_EQ(store_->Stats().prefix_evictions, 1);

  Append("s", 0, 12, 12, 2);  // then p1
  EXPECT_EQ(store_->GetPrefix("p1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats().prefix_evictions, 2);

  // p2 is older than both but referenced: never evicted.
  const std::vector<Bf16> more = Rows(3, 24, 1, kWidth);
  EXPECT_EQ(store_->Append("s", 0, 24, View2(more, kWidth)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store_->GetPrefix("p2").ok());
  EXPECT_EQ(Read("holds-p2", 0), Latent('2', 1, 0, 12, kWidth).Layer(0));
}

TEST_F(KvStoreTest, EvictingAChildMakesItsParentEvictable) {
  MakeStore(/*pages=*/6, /*layers=*/1);
  const Latent parent(1, 1, 0, 8, kWidth);
  const Latent child(2, 1, 8, 8, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("p", "", parent.View()).ok());
  ASSERT_TRUE(store_->RegisterPrefix("c", "p", child.View()).ok());
  ASSERT_TRUE(store_->CreateSequence("touch", "p").ok());  // p used after c
  ASSERT_TRUE(store_->ReleaseSequence("touch").ok());
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  Append("s", 0, 0, 8, 1);  // fills the pool (4 prefix pages + 2)

  // p is more recent but referenced by c; c goes first, then p is a candidate.
  Append("s", 0, 8, 12, 2);
  EXPECT_EQ(store_->GetPrefix("c").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetPrefix("p").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats().prefix_evictions, 2);
  EXPECT_EQ(store_->Stats().pages_prefix, 0);
}

TEST_F(KvStoreTest, EvictionKeepsAChildsReleasedParentOnlyAsLongAsTheChild) {
  MakeStore(/*pages=*/6, /*layers=*/1);
  const Latent parent(1, 1, 0, 8, kWidth);
  const Latent child(2, 1, 8, 8, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("p", "", parent.View()).ok());
  ASSERT_TRUE(store_->RegisterPrefix("c", "p", child.View()).ok());
  ASSERT_TRUE(store_->ReleasePrefix("p").ok());
  EXPECT_EQ(store_->Stats().retained_prefixes, 1);
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  Append("s", 0, 0, 12, 1);  // needs 3 pages, 2 free: evicting c frees c and its parent
  EXPECT_EQ(store_->Stats().prefix_evictions, 1);
  EXPECT_EQ(store_->Stats().retained_prefixes, 0);
  EXPECT_EQ(store_->Stats().pages_prefix, 0);
}

class BudgetTest : public KvStoreTest {
 protected:
  // Everything a reader can observe, to compare before and after a failed operation.
  struct Contents {
    KvStoreStats stats;
    std::vector<std::vector<Bf16>> rows;
    std::vector<absl::StatusOr<SequenceInfo>> sequences;
    std::vector<absl::StatusOr<PrefixInfo>> prefixes;
    bool operator==(const Contents&) const = default;
  };

  Contents Capture() {
    Contents c;
    c.stats = store_->Stats();
    for (const char* id : {"a", "b", "f", "filler"}) {
      c.sequences.push_back(store_->GetSequence(id));
      if (!c.sequences.back().ok()) continue;
      for (int layer = 0; layer < model_.layers; ++layer) c.rows.push_back(Read(id, layer));
    }
    for (const char* id : {"p", "q", "idle"}) c.prefixes.push_back(store_->GetPrefix(id));
    return c;
  }

  int64_t FreeBudgetPages() {
    const KvStoreStats stats = store_->Stats();
    return (stats.budget_bytes - stats.used_bytes) / kStorePageBytes;
  }

  // A store with something of every kind: sequences on a prefix chain, a fork, an
  // unreferenced prefix ("idle", evictable), a built expansion (evictable), and a released
  // sequence's page pinned by a snapshot.
  void Fill() {
    MakeStore(/*pages=*/40, /*layers=*/2);
    weights_ = std::make_unique<ModelWeights>(*ModelWeights::FromSeed(model_, 1));
    ASSERT_TRUE(store_->RegisterPrefix("p", "", Latent(1, 2, 0, 6, kWidth).View()).ok());
    ASSERT_TRUE(store_->RegisterPrefix("q", "p", Latent(2, 2, 6, 3, kWidth).View()).ok());
    ASSERT_TRUE(store_->RegisterPrefix("idle", "", Latent(3, 2, 0, 8, kWidth).View()).ok());
    ASSERT_TRUE(store_->CreateSequence("a", "q").ok());
    Append("a", 0, 9, 5, 4);
    ASSERT_TRUE(store_->CreateSequence("b").ok());
    Append("b", 1, 0, 7, 5);
    ASSERT_TRUE(store_->ForkSequence("a", "f").ok());
    Append("f", 0, 14, 2, 6);
    ASSERT_TRUE(store_->CreateSequence("gone").ok());
    Append("gone", 0, 0, 3, 7);
    absl::StatusOr<KvSnapshot> pin = store_->Snapshot("gone", 0);
    ASSERT_TRUE(pin.ok());
    pinned_ = std::make_unique<KvSnapshot>(*std::move(pin));
    ASSERT_TRUE(store_->ReleaseSequence("gone").ok());
    ASSERT_TRUE(store_->GetOrBuildExpanded(store_->GetPrefix("p")->key, 1, *weights_).ok());
    const KvStoreStats stats = store_->Stats();
    ASSERT_EQ(stats.pages_pinned, 1);
    ASSERT_EQ(stats.expanded_entries, 1);
    ASSERT_EQ(stats.expanded_bytes, ExpandedKvData::Bytes(2, 6, 12, 8));
    ASSERT_GT(FreeBudgetPages(), 0);
  }

  // Leaves exactly one evictable thing, p's layer-1 expansion (p itself is referenced by q
  // and the sequences), and takes every free byte of the budget.
  void FillToTheBrim() {
    Fill();
    ASSERT_TRUE(store_->ReleasePrefix("idle").ok());
    ASSERT_TRUE(store_->CreateSequence("filler").ok());
    Append("filler", 0, 0, FreeBudgetPages() * kPageSize, 8);
    ASSERT_EQ(store_->Stats().used_bytes, store_->Stats().budget_bytes);
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<KvSnapshot> pinned_;
};

TEST_F(BudgetTest, AnAppendThatCannotFitChangesNothing) {
  Fill();
  const Contents before = Capture();
  // More than the free budget, the evictable prefix and the expansion together.
  const int64_t too_many = before.stats.pages_total * kPageSize;
  const std::vector<Bf16> rows = Rows(9, 14, too_many, kWidth);
  const absl::Status s = store_->Append("a", 0, 14, View2(rows, kWidth));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("sequence 'a' layer 0"));
  EXPECT_EQ(Capture(), before);
}

TEST_F(BudgetTest, ARegistrationThatCannotFitChangesNothing) {
  Fill();
  const Contents before = Capture();
  const Latent big(9, 2, 0, 80, kWidth);
  const absl::Status s = store_->RegisterPrefix("big", "q", big.View());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("prefix 'big'"));
  EXPECT_EQ(store_->GetPrefix("big").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Capture(), before);
}

TEST_F(BudgetTest, AnExpansionThatCannotFitChangesNothing) {
  FillToTheBrim();
  // Pin the one evictable thing: nothing can make room for q's layer-0 expansion.
  absl::StatusOr<ExpandedKv> pinned =
      store_->GetOrBuildExpanded(store_->GetPrefix("p")->key, 1, *weights_);
  ASSERT_TRUE(pinned.ok());
  const Contents before = Capture();
  const absl::Status s =
      store_->GetOrBuildExpanded(store_->GetPrefix("q")->key, 0, *weights_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("expanding prefix 'q' layer 0"));
  EXPECT_EQ(Capture(), before);
}

TEST_F(BudgetTest, UnpinnedExpansionIsEvictedUnderPressureButPinnedOneIsNot) {
  FillToTheBrim();
  const int64_t next = store_->GetSequence("filler")->lengths[0];
  {
    absl::StatusOr<ExpandedKv> pinned =
        store_->GetOrBuildExpanded(store_->GetPrefix("p")->key, 1, *weights_);
    ASSERT_TRUE(pinned.ok());
    const std::vector<Bf16> one = Rows(9, next, 1, kWidth);
    EXPECT_EQ(store_->Append("filler", 0, next, View2(one, kWidth)).code(),
              absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(store_->Stats().expanded_entries, 1);
  }
  Append("filler", 0, next, 1, 9);
  const KvStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.expanded_entries, 0);
  EXPECT_EQ(stats.expanded_bytes, 0);
  EXPECT_EQ(stats.expanded_evictions, 1);
  EXPECT_EQ(stats.prefix_evictions, 0);
  EXPECT_TRUE(store_->GetPrefix("p").ok());
}

TEST_F(BudgetTest, PressureEvictsTheIdlePrefixBeforeAMoreRecentlyUsedExpansion) {
  Fill();
  ASSERT_TRUE(store_->CreateSequence("filler").ok());
  // One page more than the free budget: "idle" (registered before the expansion was
  // built) is the least recently used evictable item.
  Append("filler", 0, 0, (FreeBudgetPages() + 1) * kPageSize, 8);
  const KvStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.prefix_evictions, 1);
  EXPECT_EQ(stats.expanded_evictions, 0);
  EXPECT_EQ(store_->GetPrefix("idle").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(stats.expanded_entries, 1);
}

}  // namespace
}  // namespace mlaserve::engine
