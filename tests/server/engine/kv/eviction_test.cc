#include "server/engine/kv/eviction.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::engine {
namespace {

constexpr int64_t kPageBytes = 100;

// A prefix tree, its pages and expansions, built by hand: the planner's whole input.
class EvictionTest : public ::testing::Test {
 protected:
  PrefixNode* Prefix(const std::string& id, PrefixNode* parent, int own_pages) {
    auto node = std::make_unique<PrefixNode>();
    node->id = id;
    node->parent = parent;
    node->ready = true;
    node->pages.resize(1);
    if (parent != nullptr) {
      tree_.AddReference(parent);
      for (int32_t page : parent->pages[0]) {
        pages_.AddOwner(page, PageOwner::kPrefix);
        node->pages[0].push_back(page);
      }
    }
    for (int i = 0; i < own_pages; ++i)
      node->pages[0].push_back(pages_.Allocate(PageOwner::kPrefix));
    PrefixNode* raw = tree_.Insert(std::move(node));
    tree_.Touch(raw);
    return raw;
  }
  void Expand(PrefixNode* node, int64_t bytes, int pins) {
    ExpandedKvCache::Entry& entry = expanded_.StartBuilding(node->key, 0, bytes);
    expanded_.Publish(entry, nullptr, tree_.Tick());
    entry.pins = pins;
  }
  std::vector<std::string> Victims(int64_t bytes) {
    std::optional<EvictionPlan> plan = PlanEviction(tree_, expanded_, pages_, kPageBytes, 1, bytes);
    if (!plan.has_value()) return {"(not enough)"};
    std::vector<std::string> names;
    for (const EvictionPlan::Victim& v : plan->victims)
      names.push_back(v.layer < 0 ? v.node->id : v.node->id + "/kv");
    return names;
  }

  PrefixTree tree_;
  ExpandedKvCache expanded_;
  PageAllocator pages_{64};
};

TEST_F(EvictionTest, LeastRecentlyUsedFirstAndOnlyAsMuchAsNeeded) {
  PrefixNode* a = Prefix("a", nullptr, 2);
  PrefixNode* b = Prefix("b", nullptr, 3);
  tree_.Touch(a);  // a is now the most recent
  EXPECT_THAT(Victims(250), ::testing::ElementsAre("b"));
  EXPECT_THAT(Victims(350), ::testing::ElementsAre("b", "a"));
  EXPECT_THAT(Victims(600), ::testing::ElementsAre("(not enough)"));
  (void)b;
}

TEST_F(EvictionTest, ReferencedPrefixesAndPinnedExpansionsStay) {
  PrefixNode* a = Prefix("a", nullptr, 2);
  PrefixNode* b = Prefix("b", nullptr, 2);
  Prefix("c", nullptr, 1);
  tree_.AddReference(a);  // a sequence reads it
  Expand(b, 50, /*pins=*/1);
  tree_.AddReference(b);  // a handle on an expansion references its prefix
  EXPECT_THAT(Victims(100), ::testing::ElementsAre("c"));
  EXPECT_THAT(Victims(150), ::testing::ElementsAre("(not enough)"));
  Expand(a, 70, /*pins=*/0);  // unpinned: evictable although its prefix is not
  EXPECT_THAT(Victims(170), ::testing::ElementsAre("c", "a/kv"));
}

TEST_F(EvictionTest, AnExpansionAloneCanBeEnoughAndSharedPagesFreeNothing) {
  PrefixNode* parent = Prefix("p", nullptr, 2);
  PrefixNode* child = Prefix("c", parent, 1);  // shares p's 2 pages, references p
  Expand(parent, 40, /*pins=*/0);
  tree_.Touch(child);
  // The expansion is older than the child; evicting it frees 40.
  EXPECT_THAT(Victims(30), ::testing::ElementsAre("p/kv"));
  // The child frees only its own page (p still holds the shared ones); then p, unreferenced
  // once its child is gone, joins the candidates.
  EXPECT_THAT(Victims(100 + 40 + 200), ::testing::ElementsAre("p/kv", "c", "p"));
}

TEST_F(EvictionTest, AReleasedParentGoesWithItsLastChild) {
  PrefixNode* parent = Prefix("p", nullptr, 2);
  PrefixNode* child = Prefix("c", parent, 1);
  EXPECT_FALSE(tree_.Unregister(parent));  // released, still referenced by the child
  EXPECT_EQ(tree_.retained(), 1);
  // Evicting the child frees the released parent's pages too, without listing the parent.
  EXPECT_THAT(Victims(300), ::testing::ElementsAre("c"));
  (void)child;
}

}  // namespace
}  // namespace mlaserve::engine
