// Appends over tokens already stored (issue 27): the same rows are a retry, other rows are
// refused naming the first token that differs and change nothing, and a retry that
// straddles the stored end appends the rest. In both KV formats, for bf16 rows and for FP8
// records.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/kv/kv_store.h"
#include "tests/server/engine/kv/kv_store_test_util.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::Concat;
using ::mlaserve::engine::testing::Fp8Records;
using ::mlaserve::engine::testing::kPageSize;
using ::mlaserve::engine::testing::kWidth;
using ::mlaserve::engine::testing::ReadFp8Sequence;
using ::mlaserve::engine::testing::ReadSequence;
using ::mlaserve::engine::testing::Rows;
using ::mlaserve::engine::testing::TinyModel;
using ::mlaserve::engine::testing::View2;
using ::testing::HasSubstr;

// FP8 records of TinyModel's rows.
std::vector<std::byte> Records(const std::vector<Bf16>& rows) {
  const ModelConfig m = TinyModel();
  return Fp8Records(rows, m.dl, m.dr);
}

class AppendRetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<KvStore>> store = KvStore::Create(
        TinyModel(2),
        KvStoreOptions{.budget_bytes = 64 * kPageSize * kWidth * 2, .page_size = kPageSize});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // Rows [first, first + n) of a stored sequence's rows (kWidth each).
  static std::vector<Bf16> Slice(const std::vector<Bf16>& rows, int64_t first, int64_t n) {
    return {rows.begin() + first * kWidth, rows.begin() + (first + n) * kWidth};
  }

  std::vector<Bf16> Read(const std::string& id, int layer) {
    absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot(id, layer);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    return snapshot.ok() ? ReadSequence(*snapshot, 0) : std::vector<Bf16>{};
  }

  std::vector<std::byte> ReadFp8(const std::string& id, int layer) {
    absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot(id, layer);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    return snapshot.ok() ? ReadFp8Sequence(*snapshot, 0) : std::vector<std::byte>{};
  }

  std::unique_ptr<KvStore> store_;
};

TEST_F(AppendRetryTest, ARetryWithOtherRowsIsRefusedNamingTheTokenAndChangesNothing) {
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  const std::vector<Bf16> stored = Rows(1, 0, 6, kWidth);
  ASSERT_TRUE(store_->Append("s", 1, 0, View2(stored, kWidth)).ok());
  const KvStoreStats before = store_->Stats();

  std::vector<Bf16> retry = Slice(stored, 2, 3);                           // tokens 2..4
  EXPECT_TRUE(store_->Append("s", 1, 2, View2(retry, kWidth)).ok());       // the same: a retry
  retry[1 * kWidth + 7] = Bf16::FromBits(retry[1 * kWidth + 7].bits ^ 1);  // token 3, one bit
  const absl::Status refused = store_->Append("s", 1, 2, View2(retry, kWidth));
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("sequence 's' layer 1"));
  EXPECT_THAT(refused.message(), HasSubstr("token 3"));
  EXPECT_THAT(refused.message(), HasSubstr("rows[1]"));
  EXPECT_EQ(Read("s", 1), stored);
  EXPECT_EQ(store_->Stats(), before);
}

// A retry that covers the stored end and goes past it: the overlap is compared, the rest
// appended, across a page boundary.
TEST_F(AppendRetryTest, ARetryStraddlingTheEndAppendsTheRest) {
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  const std::vector<Bf16> all = Rows(2, 0, 11, kWidth);
  ASSERT_TRUE(store_->Append("s", 0, 0, View2(Slice(all, 0, 6), kWidth)).ok());
  ASSERT_TRUE(store_->Append("s", 0, 3, View2(Slice(all, 3, 8), kWidth)).ok());
  EXPECT_EQ(store_->GetSequence("s")->lengths[0], 11);
  EXPECT_EQ(Read("s", 0), all);
  EXPECT_EQ(store_->Stats().pages_sequence, 3);  // ceil(11 / 4), nothing written twice
}

TEST_F(AppendRetryTest, AStraddlingRetryWithOtherRowsAppendsNothing) {
  ASSERT_TRUE(store_->CreateSequence("s").ok());
  const std::vector<Bf16> stored = Rows(3, 0, 6, kWidth);
  ASSERT_TRUE(store_->Append("s", 0, 0, View2(stored, kWidth)).ok());
  const KvStoreStats before = store_->Stats();
  std::vector<Bf16> straddle = Concat({Slice(stored, 4, 2), Rows(3, 6, 5, kWidth)});
  straddle[kWidth] = Bf16::FromBits(straddle[kWidth].bits ^ 0x0100);  // token 5
  const absl::Status refused = store_->Append("s", 0, 4, View2(straddle, kWidth));
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("token 5"));
  EXPECT_EQ(store_->GetSequence("s")->lengths[0], 6);
  EXPECT_EQ(Read("s", 0), stored);
  EXPECT_EQ(store_->Stats(), before);
}

// A fork shares its source's pages: a differing retry on either side changes neither.
TEST_F(AppendRetryTest, ADifferingRetryOnAForkLeavesBothSidesAlone) {
  ASSERT_TRUE(store_->CreateSequence("a").ok());
  const std::vector<Bf16> stored = Rows(4, 0, 5, kWidth);
  ASSERT_TRUE(store_->Append("a", 0, 0, View2(stored, kWidth)).ok());
  ASSERT_TRUE(store_->ForkSequence("a", "b").ok());
  const std::vector<Bf16> other = Rows(5, 0, 5, kWidth);
  EXPECT_EQ(store_->Append("b", 0, 0, View2(other, kWidth)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Read("a", 0), stored);
  EXPECT_EQ(Read("b", 0), stored);
}

// An FP8 sequence compares what the rows quantise to (bf16 rows) or the records themselves.
TEST_F(AppendRetryTest, AnFp8SequenceComparesItsRecords) {
  ASSERT_TRUE(store_->CreateSequence("f", "", KvDtype::kFp8).ok());
  const std::vector<Bf16> rows = Rows(6, 0, 9, kWidth);
  ASSERT_TRUE(store_->Append("f", 0, 0, View2(Slice(rows, 0, 5), kWidth)).ok());
  EXPECT_TRUE(store_->Append("f", 0, 1, View2(Slice(rows, 1, 3), kWidth)).ok());
  const std::vector<std::byte> before = ReadFp8("f", 0);
  EXPECT_EQ(store_->Append("f", 0, 2, View2(Rows(7, 2, 2, kWidth), kWidth)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadFp8("f", 0), before);
  ASSERT_TRUE(store_->Append("f", 0, 3, View2(Slice(rows, 3, 6), kWidth)).ok());  // straddles
  EXPECT_EQ(ReadFp8("f", 0), Records(rows));

  // Records: the same ones are a retry, one byte off is refused, a straddle appends the rest.
  const std::vector<std::byte> records = Records(Rows(8, 0, 7, kWidth));
  const int64_t record = static_cast<int64_t>(records.size()) / 7;
  ASSERT_TRUE(store_->AppendFp8("f", 1, 0, std::span(records).first(4 * record), 4).ok());
  EXPECT_TRUE(store_->AppendFp8("f", 1, 0, std::span(records).first(4 * record), 4).ok());
  std::vector<std::byte> off(records.begin() + record, records.begin() + 3 * record);
  off[record + 3] ^= std::byte{0x01};  // token 2's content
  const absl::Status refused = store_->AppendFp8("f", 1, 1, off, 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("token 2"));
  ASSERT_TRUE(store_->AppendFp8("f", 1, 2, std::span(records).subspan(2 * record), 5).ok());
  EXPECT_EQ(ReadFp8("f", 1), records);
}

}  // namespace
}  // namespace mlaserve::engine
