#include "server/engine/decode_validation.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/kv/client_id.h"
#include "server/engine/owned_decode_query.h"

namespace mlaserve::engine {
namespace {

using ::testing::StartsWith;

// Every rule a Decode call must follow, with the message that names the field (the wire's
// names: a gRPC client sees exactly these).
class DecodeValidationTest : public ::testing::Test {
 protected:
  DecodeValidationTest() {
    info_.model.name = "tiny";
    info_.model.heads = 4;
    info_.model.layers = 3;
    info_.model.softmax_scale = 0.125f;
    info_.max_batch = 8;
    info_.max_sq = 2;
    store_ = *KvStore::Create(info_.model, {.budget_bytes = int64_t{1} << 24, .page_size = 16});
    EXPECT_TRUE(store_->CreateSequence("s", "").ok());
    EXPECT_TRUE(store_->CreateSequence("t", "").ok());
  }

  OwnedDecodeQuery Head(int sq = 1, const std::string& id = "s") const {
    OwnedDecodeQuery q;
    q.sequence_id = id;
    q.layer = 2;
    q.sq = sq;
    q.q_nope.assign(static_cast<size_t>(sq) * 4 * 128, Bf16::FromFloat(0.5f));
    q.q_pe.assign(static_cast<size_t>(sq) * 4 * 64, Bf16::FromFloat(0.5f));
    return q;
  }
  OwnedDecodeQuery Latent(int sq = 1) const {
    OwnedDecodeQuery q;
    q.sequence_id = "s";
    q.sq = sq;
    q.space = QuerySpace::kLatent;
    q.q_latent.assign(static_cast<size_t>(sq) * 4 * 576, Bf16::FromFloat(0.5f));
    return q;
  }
  // `query` at index 1 behind a valid one, so messages must name [1].
  absl::Status Second(const OwnedDecodeQuery& query) const {
    const std::vector<OwnedDecodeQuery> owned = {Head(1, "t"), query};
    return Validate(owned);
  }
  absl::Status Validate(const std::vector<OwnedDecodeQuery>& owned) const {
    const std::vector<DecodeQuery> views = Views(owned, info_.model);
    return ValidateDecodeCall(views, info_, *store_);
  }

  EngineInfo info_;
  std::unique_ptr<KvStore> store_;
};

TEST_F(DecodeValidationTest, AcceptsHeadAndLatentQueriesWithAppends) {
  OwnedDecodeQuery latent = Latent(2);
  latent.append_rows.assign(3 * 576, Bf16::FromFloat(1.0f));
  latent.append_position = 0;
  EXPECT_TRUE(Validate({Head(2, "t"), latent}).ok());
}

TEST_F(DecodeValidationTest, TheBatchMustHoldOneToMaxBatchQueries) {
  const absl::Status empty = Validate({});
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.message()), StartsWith("queries: empty"));
  std::vector<OwnedDecodeQuery> many;
  for (int i = 0; i <= info_.max_batch; ++i) many.push_back(Head(1, absl::StrCat("x", i)));
  EXPECT_THAT(std::string(Validate(many).message()),
              StartsWith("queries: 9 queries exceed limits.max_batch = 8"));
}

TEST_F(DecodeValidationTest, AnEmptySequenceIdIsInvalid) {
  OwnedDecodeQuery q = Head();
  q.sequence_id.clear();
  EXPECT_EQ(Second(q).message(), "queries[1].sequence_id is empty");
}

TEST_F(DecodeValidationTest, ASequenceIdOverTheLimitIsInvalidBeforeAnyLookup) {
  OwnedDecodeQuery q = Head(1, std::string(kMaxClientIdBytes + 1, 'x'));
  const absl::Status status = Second(q);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "queries[1].sequence_id is 1025 bytes; the limit is 1024");
}

TEST_F(DecodeValidationTest, ErrorsQuoteLongIdsShortened) {
  const std::string id = std::string(70, 'a') + "tail";
  const absl::Status status = Second(Head(1, id));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), absl::StrCat("queries[1].sequence_id: '", std::string(64, 'a'),
                                           "...' (74 bytes) is not a sequence"));
}

TEST_F(DecodeValidationTest, ALayerOutOfRangeIsInvalid) {
  for (int layer : {-1, 3}) {
    OwnedDecodeQuery q = Head();
    q.layer = layer;
    const absl::Status status = Second(q);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), absl::StrCat("queries[1].layer: ", layer, " is outside [0, 3)"));
  }
}

TEST_F(DecodeValidationTest, AnSqOutOfRangeIsInvalid) {
  for (int sq : {0, 3}) {
    OwnedDecodeQuery q = Head();
    q.sq = sq;
    const absl::Status status = Second(q);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                StartsWith(absl::StrCat("queries[1].sq: ", sq, " is outside [1, 2]")));
  }
}

TEST_F(DecodeValidationTest, WrongShapesNameTheTensor) {
  const ModelConfig& m = info_.model;
  std::vector<Bf16> wrong(4 * 64);
  // The owned queries outlive their views.
  const OwnedDecodeQuery head = Head();
  const OwnedDecodeQuery latent = Latent();
  DecodeQuery nope = head.View(m);
  nope.q_nope = *TensorView<const Bf16, 3>::Create(std::span<const Bf16>(wrong), {1, 4, 64});
  const std::vector<DecodeQuery> a = {nope};
  EXPECT_EQ(ValidateDecodeCall(a, info_, *store_).message(),
            "queries[0].head.q_nope: shape [1,4,64] != [1,4,128]");
  std::vector<Bf16> pe(8 * 64);
  DecodeQuery heads = head.View(m);
  heads.q_pe = *TensorView<const Bf16, 3>::Create(std::span<const Bf16>(pe), {1, 8, 64});
  const std::vector<DecodeQuery> b = {heads};
  EXPECT_EQ(ValidateDecodeCall(b, info_, *store_).message(),
            "queries[0].head.q_pe: shape [1,8,64] != [1,4,64]");
  OwnedDecodeQuery sq = Latent(1);
  sq.q_latent.resize(2 * 4 * 576);  // two tokens' worth for sq 1
  sq.sq = 2;
  DecodeQuery sq_view = sq.View(m);
  sq_view.sq = 1;
  const std::vector<DecodeQuery> c = {sq_view};
  EXPECT_EQ(ValidateDecodeCall(c, info_, *store_).message(),
            "queries[0].latent: shape [2,4,576] != [1,4,576]");
  std::vector<Bf16> rows(2 * 512);
  DecodeQuery append = latent.View(m);
  append.append_rows = *TensorView<const Bf16, 2>::Create(std::span<const Bf16>(rows), {2, 512});
  append.append_position = 0;
  const std::vector<DecodeQuery> d = {append};
  EXPECT_EQ(ValidateDecodeCall(d, info_, *store_).message(),
            "queries[0].append_rows: shape [2,512] != [n,576]");
}

// A tensor-parallel rank sends its share of the heads: a range of the model's in head space,
// any count in latent space; a call's queries share theirs.
TEST_F(DecodeValidationTest, HeadRangesAndLatentHeadCounts) {
  auto head_range = [&](int heads, int first_head) {
    OwnedDecodeQuery q = Head();
    q.heads = heads;
    q.first_head = first_head;
    q.q_nope.resize(static_cast<size_t>(heads) * 128);
    q.q_pe.resize(static_cast<size_t>(heads) * 64);
    return q;
  };
  auto latent = [&](int heads, int first_head = 0) {
    OwnedDecodeQuery q = Latent();
    q.heads = heads;
    q.first_head = first_head;
    q.q_latent.resize(static_cast<size_t>(heads) * 576, Bf16::FromFloat(0.5f));
    return q;
  };
  EXPECT_TRUE(Validate({head_range(2, 2)}).ok());
  EXPECT_TRUE(Validate({head_range(1, 0)}).ok());
  EXPECT_TRUE(Validate({latent(7)}).ok());
  EXPECT_TRUE(Validate({latent(kMaxLatentHeads)}).ok());
  EXPECT_EQ(Validate({head_range(2, 3)}).message(),
            "queries[0].head.q_nope: shape [1,2,128] != [1,1,128]");
  EXPECT_EQ(Validate({head_range(1, 4)}).message(),
            "queries[0].head.first_head: 4 is outside [0, 4)");
  EXPECT_EQ(Validate({head_range(1, -1)}).message(),
            "queries[0].head.first_head: -1 is outside [0, 4)");
  EXPECT_EQ(Validate({latent(2, 1)}).message(),
            "queries[0].first_head: must be 0 for a latent query");
  EXPECT_EQ(Validate({latent(kMaxLatentHeads + 1)}).message(),
            "queries[0].latent: shape [1,1025,576] != [1,4,576]");
  EXPECT_EQ(Second(latent(2)).message(),
            "queries[1]: 2 heads from head 0, but queries[0] has 4 from head 0; a call's "
            "queries share their heads");
  OwnedDecodeQuery other_range = head_range(2, 2);
  other_range.sequence_id = "t";
  EXPECT_EQ(Validate({head_range(2, 0), other_range}).message(),
            "queries[1]: 2 heads from head 2, but queries[0] has 2 from head 0; a call's "
            "queries share their heads");
}

TEST_F(DecodeValidationTest, AStridedTensorIsInvalid) {
  std::vector<Bf16> wide(4 * 2 * 128);
  const OwnedDecodeQuery head = Head();
  DecodeQuery q = head.View(info_.model);
  q.q_nope = *TensorView<const Bf16, 3>::CreateStrided(wide.data(), wide.size(), {1, 4, 128},
                                                       {1024, 256, 1});
  const std::vector<DecodeQuery> views = {q};
  EXPECT_EQ(ValidateDecodeCall(views, info_, *store_).message(),
            "queries[0].head.q_nope: not row-major and contiguous");
}

TEST_F(DecodeValidationTest, NanAndInfinityInAnyInputAreInvalid) {
  OwnedDecodeQuery q = Head();
  q.q_nope[77] = Bf16::FromBits(0x7fc0);
  EXPECT_THAT(std::string(Second(q).message()),
              StartsWith("queries[1].head.q_nope: element 77 is NaN; inputs must be finite"));
  OwnedDecodeQuery r = Latent();
  r.append_rows.assign(576, Bf16::FromFloat(1.0f));
  r.append_rows[5] = Bf16::FromBits(0xff80);  // -inf
  r.append_position = 0;
  EXPECT_THAT(std::string(Second(r).message()),
              StartsWith("queries[1].append_rows: element 5 is infinite"));
}

TEST_F(DecodeValidationTest, AppendRowsAndPositionGoTogether) {
  OwnedDecodeQuery rows_only = Latent();
  rows_only.append_rows.assign(576, Bf16::FromFloat(1.0f));
  EXPECT_THAT(std::string(Second(rows_only).message()),
              StartsWith("queries[1].append_position: missing"));
  OwnedDecodeQuery position_only = Latent();
  position_only.append_position = 3;
  EXPECT_THAT(std::string(Second(position_only).message()),
              StartsWith("queries[1].append_rows: missing"));
  OwnedDecodeQuery negative = Latent();
  negative.append_rows.assign(576, Bf16::FromFloat(1.0f));
  negative.append_position = -4;
  EXPECT_EQ(Second(negative).message(), "queries[1].append_position: -4 is negative");
}

TEST_F(DecodeValidationTest, ASequenceLayerTwiceInOneCallIsInvalid) {
  const absl::Status status = Validate({Head(1, "s"), Head(1, "s")});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              StartsWith("queries[1]: sequence 's' layer 2 appears twice"));
}

TEST_F(DecodeValidationTest, AnUnknownSequenceIsNotFound) {
  const absl::Status status = Second(Head(1, "ghost"));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "queries[1].sequence_id: 'ghost' is not a sequence");
}

}  // namespace
}  // namespace mlaserve::engine
