// KvStore: pages, lengths, ids and retries, prefix chains, forks and releases.
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

using ::mlaserve::engine::testing::Concat;
using ::mlaserve::engine::testing::kPageSize;
using ::mlaserve::engine::testing::kStorePageBytes;
using ::mlaserve::engine::testing::KvStoreTest;
using ::mlaserve::engine::testing::kWidth;
using ::mlaserve::engine::testing::Latent;
using ::mlaserve::engine::testing::ReadSequence;
using ::mlaserve::engine::testing::Rows;
using ::mlaserve::engine::testing::TinyModel;
using ::mlaserve::engine::testing::View2;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(KvStoreTest, CreateRejectsBadOptions) {
  const ModelConfig model = TinyModel();
  EXPECT_THAT(KvStore::Create(model, {.budget_bytes = 1 << 20, .page_size = 0}).status().message(),
              HasSubstr("page_size"));
  EXPECT_THAT(KvStore::Create(model, {.budget_bytes = kStorePageBytes - 1, .page_size = kPageSize})
                  .status()
                  .message(),
              HasSubstr("budget_bytes"));
  ModelConfig bad = model;
  bad.heads = 0;
  EXPECT_THAT(KvStore::Create(bad, {.budget_bytes = 1 << 20}).status().message(),
              HasSubstr("heads"));
}

TEST_F(KvStoreTest, PoolViewCoversTheBudget) {
  const PagedKvCache pool = store_->PoolView();
  EXPECT_EQ(pool.num_pages(), 64);
  EXPECT_EQ(pool.page_size(), kPageSize);
  EXPECT_EQ(pool.width(), kWidth);
  const KvStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.pages_total, 64);
  EXPECT_EQ(stats.pages_free, 64);
  EXPECT_EQ(stats.page_bytes, kStorePageBytes);
  EXPECT_EQ(stats.budget_bytes, 64 * kStorePageBytes);
}

TEST_F(KvStoreTest, AppendsAcrossPageBoundariesReadBackThroughTheBlockTable) {
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  const std::vector<Bf16> a = Append("s", 1, 0, 3, 1);  // page 0 not full
  const std::vector<Bf16> b = Append("s", 1, 3, 6, 2);  // fills page 0, page 1, into page 2
  const std::vector<Bf16> c = Append("s", 1, 9, 5, 3);  // fills page 2, into page 3

  absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot("s", 1);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->sequence(0).length, 14);
  EXPECT_EQ(snapshot->sequence(0).pages.size(), 4u);
  EXPECT_TRUE(ValidatePagedSequences(snapshot->cache(), snapshot->tables()).ok());
  EXPECT_EQ(ReadSequence(*snapshot, 0), Concat({a, b, c}));
  EXPECT_EQ(store_->Stats().pages_sequence, 4);
  EXPECT_EQ(store_->Stats().used_bytes, 4 * kStorePageBytes);
}

TEST_F(KvStoreTest, LayersHaveTheirOwnLengths) {
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  const std::vector<Bf16> l0 = Append("s", 0, 0, 5, 1);
  const std::vector<Bf16> l2 = Append("s", 2, 0, 1, 2);
  const absl::StatusOr<SequenceInfo> info = store_->GetSequence("s");
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(info->lengths, ElementsAre(5, 0, 1));
  EXPECT_EQ(Read("s", 0), l0);
  EXPECT_TRUE(Read("s", 1).empty());
  EXPECT_EQ(Read("s", 2), l2);
}

// Retries that differ and retries that straddle the end: kv_store_append_retry_test.cc.
TEST_F(KvStoreTest, RetriedAppendIsANoOpAndAGapIsRejected) {
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  const std::vector<Bf16> rows = Append("s", 0, 0, 6, 1);
  const KvStoreStats before = store_->Stats();

  EXPECT_TRUE(store_->Append("s", 0, 0, View2(rows, kWidth)).ok());  // the whole retry
  const std::vector<Bf16> middle(rows.begin() + 2 * kWidth, rows.begin() + 4 * kWidth);
  EXPECT_TRUE(store_->Append("s", 0, 2, View2(middle, kWidth)).ok());  // part of it
  EXPECT_EQ(store_->Stats(), before);
  EXPECT_EQ(Read("s", 0), rows);

  const std::vector<Bf16> four = Rows(9, 0, 4, kWidth);
  const absl::Status gap = store_->Append("s", 0, 7, View2(four, kWidth));
  EXPECT_EQ(gap.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gap.message(), HasSubstr("must start at position 6"));
  EXPECT_THAT(gap.message(), HasSubstr("not 7"));
  EXPECT_EQ(store_->Stats(), before);
  EXPECT_EQ(Read("s", 0), rows);
}

TEST_F(KvStoreTest, BadArgumentsNameTheFieldAndChangeNothing) {
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  Append("s", 0, 0, 2, 1);
  const KvStoreStats before = store_->Stats();
  const std::vector<Bf16> rows = Rows(1, 2, 2, kWidth);
  const std::vector<Bf16> narrow(2 * (kWidth - 1));

  struct Case {
    absl::Status status;
    absl::StatusCode code;
    const char* field;
  };
  const Case cases[] = {
      {store_->Append("", 0, 2, View2(rows, kWidth)), absl::StatusCode::kInvalidArgument,
       "sequence_id"},
      {store_->Append(std::string(1025, 'x'), 0, 2, View2(rows, kWidth)),
       absl::StatusCode::kInvalidArgument, "sequence_id"},
      {store_->Append("s", 3, 2, View2(rows, kWidth)), absl::StatusCode::kInvalidArgument,
       "layer 3"},
      {store_->Append("s", -1, 2, View2(rows, kWidth)), absl::StatusCode::kInvalidArgument,
       "layer -1"},
      {store_->Append("s", 0, -2, View2(rows, kWidth)), absl::StatusCode::kInvalidArgument,
       "start_position"},
      {store_->Append("s", 0, 2, View2(narrow, kWidth - 1)), absl::StatusCode::kInvalidArgument,
       "rows are 19 wide"},
      {store_->Append("s", 0, 2, View2({}, kWidth)), absl::StatusCode::kInvalidArgument,
       "rows is empty"},
      {store_->Append("t", 0, 0, View2(rows, kWidth)), absl::StatusCode::kNotFound, "'t'"},
      {store_->CreateSequence("u", "no-such-prefix"), absl::StatusCode::kNotFound,
       "no-such-prefix"},
      {store_->ForkSequence("nope", "v"), absl::StatusCode::kNotFound, "'nope'"},
      {store_->ForkSequence("s", ""), absl::StatusCode::kInvalidArgument, "new_sequence_id"},
      {store_->ForkSequence("", "v"), absl::StatusCode::kInvalidArgument, "source_sequence_id"},
      {store_->Snapshot("nope", 0).status(), absl::StatusCode::kNotFound, "'nope'"},
      {store_->Snapshot("s", 5).status(), absl::StatusCode::kInvalidArgument, "layer 5"},
      {store_->Snapshot(std::span<const std::string>(), 0).status(),
       absl::StatusCode::kInvalidArgument, "sequence_ids"},
      {store_->GetSequence("nope").status(), absl::StatusCode::kNotFound, "'nope'"},
      {store_->GetPrefix("nope").status(), absl::StatusCode::kNotFound, "'nope'"},
      {store_->ReleaseSequence(""), absl::StatusCode::kInvalidArgument, "sequence_id"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.status;
    EXPECT_THAT(c.status.message(), HasSubstr(c.field));
  }
  EXPECT_EQ(store_->Stats(), before);
}

TEST_F(KvStoreTest, RegisterPrefixValidatesTheLatent) {
  const Latent two_layers(1, 2, 0, 4, kWidth);
  EXPECT_THAT(store_->RegisterPrefix("p", "", two_layers.View()).message(),
              HasSubstr("latent has 2 layers"));
  const Latent narrow(1, 3, 0, 4, kWidth - 4);
  EXPECT_THAT(store_->RegisterPrefix("p", "", narrow.View()).message(),
              HasSubstr("latent rows are 16 wide"));
  const Latent empty(1, 3, 0, 0, kWidth);
  EXPECT_THAT(store_->RegisterPrefix("p", "", empty.View()).message(), HasSubstr("no tokens"));
  const Latent ok(1, 3, 0, 4, kWidth);
  EXPECT_THAT(store_->RegisterPrefix("", "", ok.View()).message(), HasSubstr("prefix_id"));
  EXPECT_EQ(store_->RegisterPrefix("p", "no-parent", ok.View()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats().pages_used, 0);
  EXPECT_EQ(store_->Stats().prefixes, 0);
}

TEST_F(KvStoreTest, CreateAndForkAreIdempotentAndConflictsAreAlreadyExists) {
  const Latent latent(1, 3, 0, 5, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("p", "", latent.View()).ok());
  ASSERT_TRUE(store_->CreateSequence("a").ok());
  Append("a", 0, 0, 3, 1);
  const KvStoreStats before = store_->Stats();
  EXPECT_TRUE(store_->CreateSequence("a").ok());
  EXPECT_EQ(store_->CreateSequence("a", "p").code(), absl::StatusCode::kAlreadyExists);

  ASSERT_TRUE(store_->ForkSequence("a", "f").ok());
  EXPECT_TRUE(store_->ForkSequence("a", "f").ok());
  ASSERT_TRUE(store_->CreateSequence("b", "p").ok());
  EXPECT_TRUE(store_->CreateSequence("b", "p").ok());
  EXPECT_EQ(store_->ForkSequence("b", "f").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->CreateSequence("f").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->ForkSequence("a", "b").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->Stats().sequences, before.sequences + 2);
  EXPECT_EQ(store_->Stats().pages_used, before.pages_used);  // forks and creates copy nothing
  EXPECT_EQ(Read("f", 0), Read("a", 0));
}

TEST_F(KvStoreTest, RegisterPrefixIsIdempotentAndDetectsConflicts) {
  const Latent latent(1, 3, 0, 6, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("p", "", latent.View()).ok());
  const KvStoreStats before = store_->Stats();
  const absl::StatusOr<PrefixInfo> info = store_->GetPrefix("p");
  ASSERT_TRUE(info.ok());

  EXPECT_TRUE(store_->RegisterPrefix("p", "", latent.View()).ok());
  EXPECT_EQ(store_->Stats(), before);
  EXPECT_EQ(store_->GetPrefix("p")->key, info->key);

  const Latent other_rows(2, 3, 0, 6, kWidth);
  EXPECT_EQ(store_->RegisterPrefix("p", "", other_rows.View()).code(),
            absl::StatusCode::kAlreadyExists);
  const Latent other_length(1, 3, 0, 5, kWidth);
  EXPECT_EQ(store_->RegisterPrefix("p", "", other_length.View()).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(store_->RegisterPrefix("q", "", latent.View()).ok());
  EXPECT_EQ(store_->RegisterPrefix("p", "q", latent.View()).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->GetPrefix("p")->key, info->key);
}

TEST_F(KvStoreTest, SequenceOnChildPrefixReadsParentChildAndOwnTokensInOrder) {
  const Latent parent(1, 3, 0, 6, kWidth);  // ends mid-page
  const Latent child(2, 3, 6, 5, kWidth);   // starts mid-page, ends mid-page
  ASSERT_TRUE(store_->RegisterPrefix("p", "", parent.View()).ok());
  ASSERT_TRUE(store_->RegisterPrefix("c", "p", child.View()).ok());
  // p: 2 pages per layer; c: a copy of p's tail page plus one more.
  EXPECT_EQ(store_->Stats().pages_prefix, 3 * (2 + 2));
  ASSERT_TRUE(store_->CreateSequence("s", "c").ok());
  EXPECT_EQ(store_->Stats().pages_sequence, 0);

  const absl::StatusOr<PrefixInfo> p = store_->GetPrefix("p");
  const absl::StatusOr<PrefixInfo> c = store_->GetPrefix("c");
  ASSERT_TRUE(p.ok() && c.ok());
  EXPECT_EQ(c->parent_id, "p");
  EXPECT_EQ(c->begin, 6);
  EXPECT_EQ(c->end, 11);
  EXPECT_TRUE(p->referenced);  // by its child

  for (int layer = 0; layer < 3; ++layer) {
    const std::vector<Bf16> own = Append("s", layer, 11, 7, 10 + layer);
    absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot("s", layer);
    ASSERT_TRUE(snapshot.ok());
    const SequenceSnapshot& seq = snapshot->sequence(0);
    EXPECT_EQ(ReadSequence(*snapshot, 0), Concat({parent.Layer(layer), child.Layer(layer), own}));
    ASSERT_EQ(seq.prefixes.size(), 2u);
    EXPECT_EQ(seq.prefixes[0], (PrefixSpan{"p", p->key, 0, 6}));
    EXPECT_EQ(seq.prefixes[1], (PrefixSpan{"c", c->key, 6, 11}));
    EXPECT_EQ(seq.prefix_tokens(), 11);
    EXPECT_EQ(seq.suffix_tokens(), 7);
    EXPECT_EQ(seq.suffix_first_row(), 3);
    ASSERT_EQ(seq.suffix_pages().size(), 3u);
    EXPECT_EQ(seq.suffix_pages()[0], seq.pages[2]);
  }
  // The sequence copied c's tail page (shared) and added two: 3 pages per layer.
  EXPECT_EQ(store_->Stats().pages_sequence, 3 * 3);
  // The prefixes' own rows did not change: registering them again still matches.
  EXPECT_TRUE(store_->RegisterPrefix("c", "p", child.View()).ok());
  EXPECT_TRUE(store_->RegisterPrefix("p", "", parent.View()).ok());
}

TEST_F(KvStoreTest, ForkSharesPagesAndNeitherSideSeesTheOthersAppends) {
  ASSERT_TRUE(store_->CreateSequence("a").ok());
  const std::vector<Bf16> base = Append("a", 0, 0, 6, 1);  // page 1 holds 2 of 4 rows
  ASSERT_TRUE(store_->ForkSequence("a", "b").ok());
  EXPECT_EQ(store_->Stats().pages_used, 2);

  const std::vector<Bf16> b_own = Append("b", 0, 6, 3, 2);  // copies the shared tail page
  const std::vector<Bf16> a_own = Append("a", 0, 6, 1, 3);  // b left the page: in place
  EXPECT_EQ(Read("a", 0), Concat({base, a_own}));
  EXPECT_EQ(Read("b", 0), Concat({base, b_own}));

  absl::StatusOr<KvSnapshot> a = store_->Snapshot("a", 0);
  absl::StatusOr<KvSnapshot> b = store_->Snapshot("b", 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->sequence(0).pages[0], b->sequence(0).pages[0]);  // full page: still shared
  EXPECT_NE(a->sequence(0).pages[1], b->sequence(0).pages[1]);
  // a's two pages, b's copy of the tail page and its next one; a then wrote in place.
  EXPECT_EQ(store_->Stats().pages_used, 4);

  // The other way round: the parent appends first.
  ASSERT_TRUE(store_->ForkSequence("a", "c").ok());
  const std::vector<Bf16> a_more = Append("a", 0, 7, 2, 4);
  const std::vector<Bf16> c_own = Append("c", 0, 7, 1, 5);
  EXPECT_EQ(Read("a", 0), Concat({base, a_own, a_more}));
  EXPECT_EQ(Read("c", 0), Concat({base, a_own, c_own}));
}

TEST_F(KvStoreTest, ForkOutlivesItsSource) {
  ASSERT_TRUE(store_->CreateSequence("a").ok());
  const std::vector<Bf16> base = Append("a", 2, 0, 5, 1);
  ASSERT_TRUE(store_->ForkSequence("a", "b").ok());
  ASSERT_TRUE(store_->ReleaseSequence("a").ok());
  const std::vector<Bf16> own = Append("b", 2, 5, 4, 2);  // sole owner now: in place
  EXPECT_EQ(Read("b", 2), Concat({base, own}));
  EXPECT_EQ(store_->Stats().pages_used, 3);
}

TEST_F(KvStoreTest, ReleaseIsIdempotentAndFreesEverything) {
  const Latent latent(1, 3, 0, 5, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("p", "", latent.View()).ok());
  ASSERT_TRUE(store_->CreateSequence("s", "p").ok());
  Append("s", 1, 5, 9, 1);
  ASSERT_TRUE(store_->ReleaseSequence("s").ok());
  EXPECT_TRUE(store_->ReleaseSequence("s").ok());
  EXPECT_TRUE(store_->ReleaseSequence("never-existed").ok());
  ASSERT_TRUE(store_->ReleasePrefix("p").ok());
  EXPECT_TRUE(store_->ReleasePrefix("p").ok());
  const KvStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.pages_used, 0);
  EXPECT_EQ(stats.used_bytes, 0);
  EXPECT_EQ(stats.prefixes, 0);
  EXPECT_EQ(stats.retained_prefixes, 0);
  EXPECT_EQ(stats.sequences, 0);
  EXPECT_EQ(stats.prefix_evictions, 0);  // releases are not evictions
}

TEST_F(KvStoreTest, ReleasedPrefixLivesOnForItsSequencesAndFreesItsId) {
  const Latent latent(1, 3, 0, 6, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("p", "", latent.View()).ok());
  const PrefixKey old_key = store_->GetPrefix("p")->key;
  ASSERT_TRUE(store_->CreateSequence("s", "p").ok());
  ASSERT_TRUE(store_->ReleasePrefix("p").ok());

  EXPECT_EQ(store_->GetPrefix("p").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->CreateSequence("t", "p").code(), absl::StatusCode::kNotFound);
  KvStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.prefixes, 0);
  EXPECT_EQ(stats.retained_prefixes, 1);
  EXPECT_EQ(stats.pages_prefix, 6);
  EXPECT_EQ(Read("s", 1), latent.Layer(1));
  absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot("s", 0);
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->sequence(0).prefixes[0].key, old_key);  // still described to the planner

  // The id is free again: a new registration with other rows is a different prefix.
  const Latent other(2, 3, 0, 3, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("p", "", other.View()).ok());
  EXPECT_NE(store_->GetPrefix("p")->key, old_key);

  snapshot = absl::InternalError("dropped");  // releases the snapshot's pins
  ASSERT_TRUE(store_->ReleaseSequence("s").ok());
  stats = store_->Stats();
  EXPECT_EQ(stats.retained_prefixes, 0);
  EXPECT_EQ(stats.pages_prefix, 3);  // only the new "p"
}

}  // namespace
}  // namespace mlaserve::engine
