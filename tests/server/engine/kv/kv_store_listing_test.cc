// KvStore's admin listings: id order, pages that together list every entry once, namespaces,
// the prefix filter, and page counts with sharing.

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/kv/client_id.h"
#include "server/engine/kv/kv_store.h"
#include "tests/server/engine/kv/kv_store_test_util.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::kPageSize;
using ::mlaserve::engine::testing::kWidth;
using ::mlaserve::engine::testing::Latent;
using ::mlaserve::engine::testing::Rows;
using ::mlaserve::engine::testing::TinyModel;
using ::mlaserve::engine::testing::View2;
using ::testing::ElementsAre;

constexpr int kListingLayers = 2;

// The first `limit` entries of everything.
ListRange FirstPage(int limit) {
  ListRange range;
  range.limit = limit;
  return range;
}

class KvStoreListingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<KvStore>> store = KvStore::Create(
        TinyModel(kListingLayers),
        KvStoreOptions{.budget_bytes = 512 * kPageSize * kWidth * 2, .page_size = kPageSize});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  void Append(const std::string& id, int layer, int64_t position, int64_t n) {
    const std::vector<Bf16> rows = Rows(7, position, n, kWidth);
    ASSERT_TRUE(store_->Append(id, layer, position, View2(rows, kWidth)).ok());
  }

  // Every sequence id in `range`'s order, page by page of `limit`.
  std::vector<std::string> AllSequencePages(std::string id_prefix, int limit,
                                            const std::string& on_prefix = "") {
    std::vector<std::string> ids;
    ListRange range = FirstPage(limit);
    range.id_prefix = std::move(id_prefix);
    for (int pages = 0; pages < 1000; ++pages) {
      ListPage<SequenceListing> page = store_->ListSequences(range, on_prefix);
      EXPECT_LE(page.entries.size(), static_cast<size_t>(limit));
      for (const SequenceListing& s : page.entries) ids.push_back(s.info.id);
      if (!page.more) break;
      range.after = page.entries.back().info.id;
    }
    return ids;
  }

  std::unique_ptr<KvStore> store_;
};

TEST_F(KvStoreListingTest, PagesListEverySequenceOnceInIdOrder) {
  std::set<std::string> made;
  for (int i = 0; i < 57; ++i) {
    // Ids whose creation order is not their byte order.
    const std::string id = absl::StrCat("seq-", (i * 37) % 57);
    ASSERT_TRUE(store_->CreateSequence(id).ok());
    made.insert(id);
  }
  for (const int limit : {1, 7, 57, 100}) {
    const std::vector<std::string> listed = AllSequencePages("", limit);
    EXPECT_EQ(listed, std::vector<std::string>(made.begin(), made.end())) << "limit " << limit;
  }
  ListPage<SequenceListing> first = store_->ListSequences(FirstPage(10), "");
  EXPECT_EQ(first.matching, 57);
  EXPECT_TRUE(first.more);
  EXPECT_EQ(store_->ListSequences(FirstPage(0), "").entries.size(), 0u);
}

TEST_F(KvStoreListingTest, ANamespaceListsOnlyItsOwnIds) {
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(store_->CreateSequence(NamespacedId("tenant-1", id)).ok());
    ASSERT_TRUE(store_->CreateSequence(NamespacedId("tenant-2", id)).ok());
  }
  ASSERT_TRUE(store_->CreateSequence("plain").ok());
  const std::vector<std::string> one = AllSequencePages(NamespacedId("tenant-1", ""), 2);
  EXPECT_THAT(one, ElementsAre(NamespacedId("tenant-1", "a"), NamespacedId("tenant-1", "b"),
                               NamespacedId("tenant-1", "c")));
  // A tenant whose name starts another's ("tenant-1" and "tenant-10") is not a prefix of it:
  // the closing mark ends the name.
  ASSERT_TRUE(store_->CreateSequence(NamespacedId("tenant-10", "x")).ok());
  EXPECT_EQ(AllSequencePages(NamespacedId("tenant-1", ""), 10).size(), 3u);
  EXPECT_EQ(AllSequencePages("", 100).size(), 8u);
}

TEST_F(KvStoreListingTest, PrefixesAndTheSequencesOnThemWithTheirPages) {
  const Latent root(1, kListingLayers, 0, 6, kWidth);   // 2 pages per layer
  const Latent child(2, kListingLayers, 6, 4, kWidth);  // tokens 6..9: pages 2 of its own per layer
  ASSERT_TRUE(store_->RegisterPrefix("system", "", root.View()).ok());
  ASSERT_TRUE(store_->RegisterPrefix("system/tools", "system", child.View()).ok());
  ASSERT_TRUE(store_->CreateSequence("on-root", "system").ok());
  ASSERT_TRUE(store_->CreateSequence("bare").ok());
  Append("bare", 0, 0, 5);  // 2 pages on layer 0, none on layer 1

  ListPage<PrefixListing> prefixes = store_->ListPrefixes(FirstPage(10));
  ASSERT_EQ(prefixes.entries.size(), 2u);
  const PrefixListing& system = prefixes.entries[0];
  EXPECT_EQ(system.info.id, "system");
  EXPECT_EQ(system.info.end, 6);
  EXPECT_TRUE(system.info.referenced);
  EXPECT_EQ(system.pages, 2 * kListingLayers);
  EXPECT_EQ(prefixes.entries[1].info.id, "system/tools");
  EXPECT_EQ(prefixes.entries[1].info.parent_id, "system");
  EXPECT_EQ(prefixes.entries[1].info.end - prefixes.entries[1].info.begin, 4);

  // A fork shares every page of its source until one of them appends.
  ASSERT_TRUE(store_->ForkSequence("bare", "bare-fork").ok());
  ListPage<SequenceListing> sequences = store_->ListSequences(FirstPage(10), "");
  ASSERT_EQ(sequences.entries.size(), 3u);
  const SequenceListing& bare = sequences.entries[0];
  EXPECT_EQ(bare.info.id, "bare");
  EXPECT_THAT(bare.info.lengths, ElementsAre(5, 0));
  EXPECT_EQ(bare.pages, 2);
  EXPECT_EQ(bare.shared_pages, 2);
  const SequenceListing& on_root = sequences.entries[2];
  EXPECT_EQ(on_root.info.prefix_id, "system");
  EXPECT_THAT(on_root.info.lengths, ElementsAre(6, 6));
  EXPECT_EQ(on_root.pages, 2 * kListingLayers);
  EXPECT_EQ(on_root.shared_pages, 2 * kListingLayers);  // the prefix's

  EXPECT_EQ(AllSequencePages("", 10, "system"), std::vector<std::string>{"on-root"});
  EXPECT_TRUE(AllSequencePages("", 10, "system/tools").empty());
  // A released prefix is no longer listed; the sequence on it keeps it alive.
  ASSERT_TRUE(store_->ReleasePrefix("system/tools").ok());
  EXPECT_EQ(store_->ListPrefixes(FirstPage(10)).entries.size(), 1u);
}

}  // namespace
}  // namespace mlaserve::engine
