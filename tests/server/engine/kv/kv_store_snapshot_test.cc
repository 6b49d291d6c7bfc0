// KvStore's expansions and snapshots: expanded K/V against the kernels', snapshots that pin
// their pages, and appends, forks and retries racing each other.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/core/random_fill.h"
#include "kernels/mla/naive.h"
#include "server/engine/kv/kv_store.h"
#include "tests/server/engine/kv/kv_store_fixture.h"
#include "tests/server/engine/kv/kv_store_test_util.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::Concat;
using ::mlaserve::engine::testing::kPageSize;
using ::mlaserve::engine::testing::KvStoreTest;
using ::mlaserve::engine::testing::kWidth;
using ::mlaserve::engine::testing::Latent;
using ::mlaserve::engine::testing::ReadSequence;
using ::mlaserve::engine::testing::Rows;
using ::mlaserve::engine::testing::View2;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(KvStoreTest, ExpansionMatchesExpandHeadKvAndCountsInTheBudget) {
  const absl::StatusOr<ModelWeights> weights = ModelWeights::FromSeed(model_, 4);
  ASSERT_TRUE(weights.ok());
  // Finite, normal-ish latent values, so the expansion is an ordinary GEMM.
  std::vector<Bf16> root_rows(3 * 5 * kWidth), child_rows(3 * 3 * kWidth);
  Rng rng(5);
  FillNormal(root_rows, 1.0, rng);
  FillNormal(child_rows, 1.0, rng);
  const auto view = [](const std::vector<Bf16>& rows, int64_t tokens) {
    return *TensorView<const Bf16, 3>::Create(std::span<const Bf16>(rows), {3, tokens, kWidth});
  };
  ASSERT_TRUE(store_->RegisterPrefix("root", "", view(root_rows, 5)).ok());
  ASSERT_TRUE(store_->RegisterPrefix("child", "root", view(child_rows, 3)).ok());
  const PrefixKey key = store_->GetPrefix("child")->key;
  const int64_t latent_bytes = store_->Stats().used_bytes;

  const int layer = 1;
  absl::StatusOr<ExpandedKv> expanded = store_->GetOrBuildExpanded(key, layer, *weights);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  EXPECT_EQ(expanded->begin(), 5);  // the child's own tokens only
  EXPECT_EQ(expanded->end(), 8);
  EXPECT_EQ(expanded->heads(), model_.heads);

  std::vector<float> latent(3 * kWidth);
  for (int i = 0; i < 3 * kWidth; ++i) latent[i] = child_rows[layer * 3 * kWidth + i].ToFloat();
  for (int h = 0; h < model_.heads; ++h) {
    std::vector<Bf16> k(3 * model_.dqk()), v(3 * model_.dv);
    ExpandHeadKv(latent.data(), kWidth, 3, model_.dr, weights->Layer(layer), h, k.data(), v.data());
    const HeadKv head = expanded->Head(h);
    ASSERT_EQ(head.length, 3);
    ASSERT_EQ(head.ldk, model_.dqk());
    ASSERT_EQ(head.ldv, model_.dv);
    for (int i = 0; i < 3 * model_.dqk(); ++i) ASSERT_EQ(head.k[i], k[i]) << "head " << h;
    for (int i = 0; i < 3 * model_.dv; ++i) ASSERT_EQ(head.v[i], v[i]) << "head " << h;
  }

  const int64_t bytes = ExpandedKvData::Bytes(model_.heads, 3, model_.dqk(), model_.dv);
  EXPECT_EQ(bytes, 2 * 3 * (12 + 8) * 2);
  KvStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.expanded_bytes, bytes);
  EXPECT_EQ(stats.expanded_entries, 1);
  EXPECT_EQ(stats.used_bytes, latent_bytes + bytes);

  // Built once: a second call shares the data.
  absl::StatusOr<ExpandedKv> again = store_->GetOrBuildExpanded(key, layer, *weights);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->Head(1).k, expanded->Head(1).k);
  EXPECT_EQ(store_->Stats().expanded_bytes, bytes);

  // A handle keeps the prefix alive after release; the last one frees it with its expansion.
  ASSERT_TRUE(store_->ReleasePrefix("child").ok());
  EXPECT_EQ(store_->Stats().retained_prefixes, 1);
  expanded = absl::InternalError("dropped");
  again = absl::InternalError("dropped");
  stats = store_->Stats();
  EXPECT_EQ(stats.retained_prefixes, 0);
  EXPECT_EQ(stats.expanded_bytes, 0);
  EXPECT_EQ(store_->GetOrBuildExpanded(key, layer, *weights).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(KvStoreTest, ExpansionRejectsWeightsOfAnotherModel) {
  ASSERT_TRUE(store_->RegisterPrefix("p", "", Latent(1, 3, 0, 4, kWidth).View()).ok());
  ModelConfig other = model_;
  other.heads = 4;
  const absl::StatusOr<ModelWeights> weights = ModelWeights::FromSeed(other, 1);
  const absl::Status s =
      store_->GetOrBuildExpanded(store_->GetPrefix("p")->key, 0, *weights).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("heads 4"));
}

TEST_F(KvStoreTest, BatchSnapshotBuildsKernelTables) {
  const Latent latent(1, 3, 0, 5, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("p", "", latent.View()).ok());
  ASSERT_TRUE(store_->CreateSequence("empty").ok());
  ASSERT_TRUE(store_->CreateSequence("on-p", "p").ok());
  ASSERT_TRUE(store_->CreateSequence("own").ok());
  const std::vector<Bf16> own = Append("own", 2, 0, 9, 1);
  const std::vector<std::string> ids = {"empty", "on-p", "own", "on-p"};

  absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot(ids, 2);
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->batch(), 4);
  EXPECT_EQ(snapshot->layer(), 2);
  const PagedSequences tables = snapshot->tables();
  EXPECT_THAT(std::vector<int32_t>(tables.seqlens.begin(), tables.seqlens.end()),
              ElementsAre(0, 5, 9, 5));
  EXPECT_EQ(tables.block_table.dim(1), 3);
  EXPECT_EQ(tables.block_table(0, 0), -1);  // unused slots
  EXPECT_TRUE(ValidatePagedSequences(snapshot->cache(), tables).ok());
  EXPECT_TRUE(ReadSequence(*snapshot, 0).empty());
  EXPECT_EQ(ReadSequence(*snapshot, 1), latent.Layer(2));
  EXPECT_EQ(ReadSequence(*snapshot, 2), own);
  EXPECT_EQ(ReadSequence(*snapshot, 3), latent.Layer(2));
  EXPECT_TRUE(snapshot->sequence(0).prefixes.empty());
  EXPECT_EQ(snapshot->sequence(1).prefix_tokens(), 5);
  EXPECT_EQ(snapshot->sequence(1).suffix_tokens(), 0);

  // A batch naming an unknown sequence pins nothing.
  const KvStoreStats before = store_->Stats();
  const std::vector<std::string> bad = {"own", "missing"};
  EXPECT_EQ(store_->Snapshot(bad, 2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats(), before);
}

TEST_F(KvStoreTest, SnapshotPinsItsPagesAcrossAConcurrentRelease) {
  MakeStore(/*pages=*/6, /*layers=*/1);
  ASSERT_TRUE(store_->CreateSequence("a").ok());
  const std::vector<Bf16> rows = Append("a", 0, 0, 10, 1);  // 3 pages
  absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot("a", 0);
  ASSERT_TRUE(snapshot.ok());

  absl::Status refill;
  std::thread other([&] {
    EXPECT_TRUE(store_->ReleaseSequence("a").ok());
    EXPECT_TRUE(store_->CreateSequence("b").ok());
    // Six pages' worth: only three are free while the snapshot lives.
    const std::vector<Bf16> big = Rows(2, 0, 24, kWidth);
    refill = store_->Append("b", 0, 0, View2(big, kWidth));
    const std::vector<Bf16> fits = Rows(3, 0, 12, kWidth);
    EXPECT_TRUE(store_->Append("b", 0, 0, View2(fits, kWidth)).ok());
  });
  other.join();
  EXPECT_EQ(refill.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->Stats().pages_pinned, 3);
  EXPECT_EQ(ReadSequence(*snapshot, 0), rows);

  snapshot = absl::InternalError("dropped");
  EXPECT_EQ(store_->Stats().pages_pinned, 0);
  EXPECT_EQ(store_->Stats().pages_free, 3);
}

TEST_F(KvStoreTest, SnapshotDoesNotSeeLaterAppendsToTheSamePage) {
  ASSERT_TRUE(store_->CreateSequence("a").ok());
  const std::vector<Bf16> rows = Append("a", 0, 0, 2, 1);
  absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot("a", 0);
  ASSERT_TRUE(snapshot.ok());
  const std::vector<Bf16> more = Append("a", 0, 2, 5, 2);  // same page, in place, then one more
  EXPECT_EQ(snapshot->sequence(0).length, 2);
  EXPECT_EQ(ReadSequence(*snapshot, 0), rows);
  EXPECT_EQ(Read("a", 0), Concat({rows, more}));
}

// A fork taken while its source is being appended to must not share the page the append is
// writing past the published length: once the source is gone, the fork would write over
// rows a snapshot of the source still reads. A long append makes the fork very likely to
// land while it is in flight.
TEST_F(KvStoreTest, ForkDuringAnAppendNeverLetsTheForkOverwriteTheSourcesRows) {
  constexpr int64_t kLong = 100000;
  MakeStore(/*pages=*/3 * kLong / kPageSize, /*layers=*/1);
  const std::vector<Bf16> tail = Rows(1, 2, kLong, kWidth);
  for (int round = 0; round < 5; ++round) {
    const std::string a = absl::StrCat("a", round), b = absl::StrCat("b", round);
    ASSERT_TRUE(store_->CreateSequence(a).ok());
    const std::vector<Bf16> head = Append(a, 0, 0, 2, 0);  // the last page has room
    std::thread appender([&] { EXPECT_TRUE(store_->Append(a, 0, 2, View2(tail, kWidth)).ok()); });
    std::thread forker([&] { EXPECT_TRUE(store_->ForkSequence(a, b).ok()); });
    appender.join();
    forker.join();

    absl::StatusOr<KvSnapshot> source = store_->Snapshot(a, 0);
    ASSERT_TRUE(source.ok());
    ASSERT_TRUE(store_->ReleaseSequence(a).ok());
    const int64_t fork_length = store_->GetSequence(b)->lengths[0];
    Append(b, 0, fork_length, kPageSize, 2);
    ASSERT_EQ(ReadSequence(*source, 0), Concat({head, tail}));
    ASSERT_TRUE(store_->ReleaseSequence(b).ok());
  }
}

TEST_F(KvStoreTest, ConcurrentRetriesOfOneAppendApplyItOnce) {
  for (int round = 0; round < 50; ++round) {
    const std::string id = absl::StrCat("s", round);
    ASSERT_TRUE(store_->CreateSequence(id).ok());
    const std::vector<Bf16> rows = Rows(round, 0, 7, kWidth);
    absl::Status first, second;
    std::thread t1([&] { first = store_->Append(id, 0, 0, View2(rows, kWidth)); });
    std::thread t2([&] { second = store_->Append(id, 0, 0, View2(rows, kWidth)); });
    t1.join();
    t2.join();
    EXPECT_TRUE(first.ok()) << first;
    EXPECT_TRUE(second.ok()) << second;
    EXPECT_EQ(store_->GetSequence(id)->lengths[0], 7);
    EXPECT_EQ(Read(id, 0), rows);
    ASSERT_TRUE(store_->ReleaseSequence(id).ok());
  }
  EXPECT_EQ(store_->Stats().pages_used, 0);
}

}  // namespace
}  // namespace mlaserve::engine
