// KvStore's FP8 sequences: quantised rows, inherited formats, records appended as they are.
#include <cstring>
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
using ::mlaserve::engine::testing::Fp8Records;
using ::mlaserve::engine::testing::kPageSize;
using ::mlaserve::engine::testing::kStorePageBytes;
using ::mlaserve::engine::testing::KvStoreTest;
using ::mlaserve::engine::testing::kWidth;
using ::mlaserve::engine::testing::Latent;
using ::mlaserve::engine::testing::ReadFp8Sequence;
using ::mlaserve::engine::testing::ReadSequence;
using ::mlaserve::engine::testing::Rows;
using ::mlaserve::engine::testing::TinyModel;
using ::testing::HasSubstr;

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
  auto store = KvStore::Create(model_, KvStoreOptions{.budget_bytes = 64 * kStorePageBytes,
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

}  // namespace
}  // namespace mlaserve::engine
