#include "server/engine/kv/kv_store.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/core/random_fill.h"
#include "kernels/mla/naive.h"
#include "tests/server/engine/kv/kv_store_test_util.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::Concat;
using ::mlaserve::engine::testing::Fp8Records;
using ::mlaserve::engine::testing::kPageSize;
using ::mlaserve::engine::testing::kWidth;
using ::mlaserve::engine::testing::Latent;
using ::mlaserve::engine::testing::ReadFp8Sequence;
using ::mlaserve::engine::testing::ReadSequence;
using ::mlaserve::engine::testing::Rows;
using ::mlaserve::engine::testing::TinyModel;
using ::mlaserve::engine::testing::View2;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kPageBytes = kPageSize * kWidth * 2;  // 160

class KvStoreTest : public ::testing::Test {
 protected:
  void MakeStore(int64_t pages, int layers = 3) {
    model_ = TinyModel(layers);
    absl::StatusOr<std::unique_ptr<KvStore>> store = KvStore::Create(
        model_, KvStoreOptions{.budget_bytes = pages * kPageBytes, .page_size = kPageSize});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void SetUp() override { MakeStore(64); }

  // Appends Rows(tag, position, n) to one layer; returns the rows.
  std::vector<Bf16> Append(const std::string& id, int layer, int64_t position, int64_t n,
                           uint64_t tag) {
    std::vector<Bf16> rows = Rows(tag, position, n, kWidth);
    const absl::Status s = store_->Append(id, layer, position, View2(rows, kWidth));
    EXPECT_TRUE(s.ok()) << s;
    return rows;
  }

  std::vector<Bf16> Read(const std::string& id, int layer) {
    absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot(id, layer);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    return snapshot.ok() ? ReadSequence(*snapshot, 0) : std::vector<Bf16>{};
  }

  ModelConfig model_;
  std::unique_ptr<KvStore> store_;
};

TEST_F(KvStoreTest, CreateRejectsBadOptions) {
  const ModelConfig model = TinyModel();
  EXPECT_THAT(KvStore::Create(model, {.budget_bytes = 1 << 20, .page_size = 0}).status().message(),
              HasSubstr("page_size"));
  EXPECT_THAT(KvStore::Create(model, {.budget_bytes = kPageBytes - 1, .page_size = kPageSize})
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
  EXPECT_EQ(stats.page_bytes, kPageBytes);
  EXPECT_EQ(stats.budget_bytes, 64 * kPageBytes);
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
  EXPECT_EQ(store_->Stats().used_bytes, 4 * kPageBytes);
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

// TinyModel's FP8 token is 16 + 4 + 2 * 4 = 28 bytes: a 160-byte page slot holds 5 of them.
constexpr int kFp8PageTokens = 5;

std::vector<std::byte> Bytes(std::initializer_list<std::vector<std::byte>> parts) {
  std::vector<std::byte> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

TEST_F(KvStoreTest, Fp8SequencesHoldQuantisedRowsWithMoreTokensPerPage) {
  EXPECT_EQ(store_->Stats().page_tokens_fp8, kFp8PageTokens);
  ASSERT_TRUE(store_->CreateSequence("f", "", KvDtype::kFp8).ok());
  ASSERT_TRUE(store_->CreateSequence("b", "", KvDtype::kBf16).ok());
  EXPECT_EQ(store_->GetSequence("f")->kv_dtype, KvDtype::kFp8);
  const std::vector<Bf16> rows = Append("f", 0, 0, 20, 1);
  Append("b", 0, 0, 20, 1);
  absl::StatusOr<KvSnapshot> f = store_->Snapshot("f", 0);
  absl::StatusOr<KvSnapshot> b = store_->Snapshot("b", 0);
  ASSERT_TRUE(f.ok() && b.ok());
  EXPECT_EQ(f->sequence(0).kv_dtype, KvDtype::kFp8);
  EXPECT_EQ(f->sequence(0).page_size, kFp8PageTokens);
  EXPECT_EQ(f->sequence(0).pages.size(), 4u);  // 20 tokens: 4 FP8 pages, 5 bf16 ones
  EXPECT_EQ(b->sequence(0).pages.size(), 5u);
  EXPECT_EQ(ReadFp8Sequence(*f, 0), Fp8Records(rows, 16, 4));
  EXPECT_EQ(ReadSequence(*b, 0), rows);
}

TEST_F(KvStoreTest, FormatsAreInheritedAndAMismatchNamesKvDtype) {
  const Latent latent(1, 3, 0, 7, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("p", "", latent.View(), KvDtype::kFp8).ok());
  EXPECT_EQ(store_->GetPrefix("p")->kv_dtype, KvDtype::kFp8);
  const Latent child(2, 3, 7, 3, kWidth);
  ASSERT_TRUE(store_->RegisterPrefix("c", "p", child.View()).ok());  // inherits
  EXPECT_EQ(store_->GetPrefix("c")->kv_dtype, KvDtype::kFp8);
  const absl::Status bad_child = store_->RegisterPrefix("d", "p", child.View(), KvDtype::kBf16);
  EXPECT_EQ(bad_child.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_child.message(), HasSubstr("kv_dtype"));

  ASSERT_TRUE(store_->CreateSequence("s", "c").ok());
  EXPECT_EQ(store_->GetSequence("s")->kv_dtype, KvDtype::kFp8);
  const absl::Status bad_sequence = store_->CreateSequence("t", "c", KvDtype::kBf16);
  EXPECT_EQ(bad_sequence.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_sequence.message(), HasSubstr("kv_dtype"));
  EXPECT_EQ(store_->GetSequence("t").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store_->ForkSequence("s", "u").ok());
  EXPECT_EQ(store_->GetSequence("u")->kv_dtype, KvDtype::kFp8);
  // A retry is recognised; the same id in another format is a conflict.
  EXPECT_TRUE(store_->RegisterPrefix("p", "", latent.View(), KvDtype::kFp8).ok());
  EXPECT_TRUE(store_->RegisterPrefix("p", "", latent.View()).ok());
  EXPECT_EQ(store_->RegisterPrefix("p", "", latent.View(), KvDtype::kBf16).code(),
            absl::StatusCode::kAlreadyExists);
  const Latent other(3, 3, 0, 7, kWidth);
  EXPECT_EQ(store_->RegisterPrefix("p", "", other.View(), KvDtype::kFp8).code(),
            absl::StatusCode::kAlreadyExists);

  // The sequence reads the chain's tokens, then its own, all in FP8.
  const std::vector<Bf16> own = Append("s", 1, 10, 4, 9);
  absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot("s", 1);
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(ReadFp8Sequence(*snapshot, 0),
            Bytes({Fp8Records(latent.Layer(1), 16, 4), Fp8Records(child.Layer(1), 16, 4),
                   Fp8Records(own, 16, 4)}));
}

TEST_F(KvStoreTest, TheStoreDefaultFormatAppliesToRoots) {
  model_ = TinyModel(2);
  auto store = KvStore::Create(model_, KvStoreOptions{.budget_bytes = 64 * kPageBytes,
                                                      .page_size = kPageSize,
                                                      .default_kv_dtype = KvDtype::kFp8});
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->CreateSequence("a").ok());
  EXPECT_EQ((*store)->GetSequence("a")->kv_dtype, KvDtype::kFp8);
  ASSERT_TRUE((*store)->CreateSequence("b", "", KvDtype::kBf16).ok());
  EXPECT_EQ((*store)->GetSequence("b")->kv_dtype, KvDtype::kBf16);
}

TEST_F(KvStoreTest, Fp8RecordsAppendAsTheyAreAndBadOnesChangeNothing) {
  ASSERT_TRUE(store_->CreateSequence("f", "", KvDtype::kFp8).ok());
  ASSERT_TRUE(store_->CreateSequence("b", "", KvDtype::kBf16).ok());
  const std::vector<std::byte> records = Fp8Records(Rows(4, 0, 7, kWidth), 16, 4);
  ASSERT_TRUE(store_->AppendFp8("f", 2, 0, records, 7).ok());
  EXPECT_TRUE(store_->AppendFp8("f", 2, 0, records, 7).ok());  // a retry
  absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot("f", 2);
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(ReadFp8Sequence(*snapshot, 0), records);

  EXPECT_EQ(store_->AppendFp8("b", 0, 0, records, 7).code(), absl::StatusCode::kFailedPrecondition);
  const KvStoreStats before = store_->Stats();
  auto expect_refused = [&](std::vector<std::byte> bad, const std::string& names) {
    const absl::Status s = store_->AppendFp8("f", 2, 7, bad, 7);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << names;
    EXPECT_THAT(s.message(), HasSubstr(names));
  };
  std::vector<std::byte> bad = records;
  const float zero = 0.0f, nan = std::nanf("");
  std::memcpy(bad.data() + 3 * 28 + 16, &zero, 4);
  expect_refused(bad, "rows[3] has scale 0");
  bad = records;
  std::memcpy(bad.data() + 5 * 28 + 16, &nan, 4);
  expect_refused(bad, "rows[5] has scale nan");
  bad = records;
  bad[6 * 28 + 2] = std::byte{0xff};
  expect_refused(bad, "rows[6] content[2]");
  bad = records;
  bad[1 * 28 + 20 + 3] = std::byte{0x7f};  // high byte of rope[1]: exponent all ones
  bad[1 * 28 + 20 + 2] = std::byte{0x80};
  expect_refused(bad, "rows[1] rope[1]");
  bad.resize(records.size() - 1);
  expect_refused(bad, "bytes");
  EXPECT_EQ(store_->Stats(), before);
  EXPECT_EQ(store_->GetSequence("f")->lengths[2], 7);
}

TEST_F(KvStoreTest, Fp8ForksCopyTheSharedTailPageOnWrite) {
  ASSERT_TRUE(store_->CreateSequence("a", "", KvDtype::kFp8).ok());
  const std::vector<Bf16> base = Append("a", 0, 0, 7, 1);  // page 1 holds 2 of 5 tokens
  ASSERT_TRUE(store_->ForkSequence("a", "b").ok());
  const std::vector<Bf16> b_own = Append("b", 0, 7, 4, 2);
  const std::vector<Bf16> a_own = Append("a", 0, 7, 1, 3);
  absl::StatusOr<KvSnapshot> a = store_->Snapshot("a", 0);
  absl::StatusOr<KvSnapshot> b = store_->Snapshot("b", 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(ReadFp8Sequence(*a, 0), Fp8Records(Concat({base, a_own}), 16, 4));
  EXPECT_EQ(ReadFp8Sequence(*b, 0), Fp8Records(Concat({base, b_own}), 16, 4));
  EXPECT_EQ(a->sequence(0).pages[0], b->sequence(0).pages[0]);
  EXPECT_NE(a->sequence(0).pages[1], b->sequence(0).pages[1]);
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
    return (stats.budget_bytes - stats.used_bytes) / kPageBytes;
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
