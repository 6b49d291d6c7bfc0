#include "server/service/decode_codec.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/service/mock_engine.h"
#include "tests/server/service/wire_tensors.h"

namespace mlaserve::service {
namespace {

using testing::Bf16Zeros;
using ::testing::HasSubstr;
using testing::SmallEngineInfo;
using ::testing::StartsWith;

class DecodeCodecTest : public ::testing::Test {
 protected:
  // A valid head-space query for SmallEngineInfo (4 heads, dn 128, dr 64).
  v1::DecodeQuery HeadQuery(int sq = 1) const {
    v1::DecodeQuery query;
    query.set_sequence_id("s");
    query.set_layer(2);
    query.set_sq(sq);
    *query.mutable_head()->mutable_q_nope() = Bf16Zeros({sq, 4, 128});
    *query.mutable_head()->mutable_q_pe() = Bf16Zeros({sq, 4, 64});
    return query;
  }
  v1::DecodeQuery LatentQuery(int sq = 1) const {
    v1::DecodeQuery query;
    query.set_sequence_id("s");
    query.set_sq(sq);
    *query.mutable_latent() = Bf16Zeros({sq, 4, 576});
    return query;
  }
  // The request with `query` at index 1 behind a valid one, so messages must name [1].
  v1::DecodeRequest WithSecond(const v1::DecodeQuery& query) const {
    v1::DecodeRequest request;
    *request.add_queries() = HeadQuery();
    *request.add_queries() = query;
    return request;
  }
  absl::Status Parse(const v1::DecodeRequest& request) const {
    return ParseDecodeRequest(request).status();
  }

  engine::EngineInfo info_ = SmallEngineInfo();
};

TEST_F(DecodeCodecTest, ParsesHeadAndLatentQueriesIntoViewsOfTheRequest) {
  v1::DecodeRequest request;
  *request.add_queries() = HeadQuery(2);
  v1::DecodeQuery latent = LatentQuery();
  *latent.mutable_append_rows() = Bf16Zeros({3, 576});
  latent.set_append_position(17);
  *request.add_queries() = latent;
  auto parsed = ParseDecodeRequest(request);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ((*parsed)->queries.size(), 2u);
  EXPECT_EQ((*parsed)->output_dtype, v1::DTYPE_BF16);  // unspecified means bf16
  const engine::DecodeQuery& head = (*parsed)->queries[0];
  EXPECT_EQ(head.space, engine::QuerySpace::kHead);
  EXPECT_EQ(head.layer, 2);
  EXPECT_EQ(head.sq, 2);
  EXPECT_EQ(head.q_nope.shape(), (std::array<int64_t, 3>{2, 4, 128}));
  EXPECT_EQ(head.q_pe.shape(), (std::array<int64_t, 3>{2, 4, 64}));
  EXPECT_EQ(head.output, ElementType::kBf16);
  EXPECT_EQ(head.append_position, -1);
  // bf16 tensors are not copied: the engine reads the request's own bytes.
  EXPECT_EQ(static_cast<const void*>(head.q_nope.data()),
            request.queries(0).head().q_nope().data().data());
  const engine::DecodeQuery& lat = (*parsed)->queries[1];
  EXPECT_EQ(lat.space, engine::QuerySpace::kLatent);
  EXPECT_EQ(lat.q_latent.size(), 4 * 576);
  EXPECT_EQ(lat.append_rows.shape(), (std::array<int64_t, 2>{3, 576}));
  EXPECT_EQ(lat.append_position, 17);
  EXPECT_TRUE((*parsed)->converted.empty());
}

TEST_F(DecodeCodecTest, CarriesTheCallsScaleAndAHeadRangesFirstHead) {
  v1::DecodeRequest request;
  *request.add_queries() = HeadQuery();
  auto parsed = ParseDecodeRequest(request);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE((*parsed)->softmax_scale.has_value());  // the model's
  EXPECT_EQ((*parsed)->queries[0].first_head, 0);
  request.set_softmax_scale(0.0625f);
  request.mutable_queries(0)->mutable_head()->set_first_head(3);
  parsed = ParseDecodeRequest(request);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)->softmax_scale, 0.0625f);
  EXPECT_EQ((*parsed)->queries[0].first_head, 3);
}

TEST_F(DecodeCodecTest, CarriesTheCallsBatchInvariantChoiceOnlyWhenMade) {
  v1::DecodeRequest request;
  *request.add_queries() = HeadQuery();
  request.mutable_options()->set_output_dtype(v1::DTYPE_BF16);
  auto parsed = ParseDecodeRequest(request);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE((*parsed)->batch_invariant.has_value());  // the server's default
  for (const bool choice : {true, false}) {
    request.mutable_options()->set_batch_invariant(choice);
    parsed = ParseDecodeRequest(request);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ((*parsed)->batch_invariant, choice);
  }
}

TEST_F(DecodeCodecTest, Fp32AndFp16InputsAreRoundedToBf16AndAskForFp32Answers) {
  v1::DecodeRequest request;
  v1::DecodeQuery query = LatentQuery();
  v1::Tensor& q = *query.mutable_latent();
  q.set_dtype(v1::DTYPE_FP32);
  std::vector<float> values(4 * 576, 0.0f);
  values[5] = 1.0f + 1.0f / 512;  // halfway between two bf16 values: rounds to even (1.0)
  values[6] = 3.14159f;
  q.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  *request.add_queries() = query;
  request.set_output_dtype(v1::DTYPE_FP16);
  auto parsed = ParseDecodeRequest(request);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const engine::DecodeQuery& lat = (*parsed)->queries[0];
  EXPECT_EQ(lat.q_latent.data()[5].ToFloat(), 1.0f);
  EXPECT_EQ(lat.q_latent.data()[6], Bf16::FromFloat(3.14159f));
  EXPECT_EQ(lat.output, ElementType::kFp32);  // fp16 answers are rounded from fp32 at the edge
  EXPECT_EQ((*parsed)->converted.size(), 1u);
}

TEST_F(DecodeCodecTest, AnUnknownOutputDtypeIsInvalid) {
  v1::DecodeRequest request = WithSecond(HeadQuery());
  request.set_output_dtype(static_cast<v1::DType>(9));
  const absl::Status status = Parse(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("output_dtype: 9"));
}

TEST_F(DecodeCodecTest, AQueryWithoutQIsInvalid) {
  v1::DecodeQuery query = HeadQuery();
  query.clear_head();
  EXPECT_EQ(Parse(WithSecond(query)).message(), "queries[1].q: neither head nor latent is set");
}

TEST_F(DecodeCodecTest, AMissingHeadTensorIsInvalid) {
  v1::DecodeQuery query = HeadQuery();
  query.mutable_head()->clear_q_pe();
  const absl::Status status = Parse(WithSecond(query));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("queries[1].head.q_pe: missing"));
}

TEST_F(DecodeCodecTest, ATensorOfAnotherRankNamesTheTensor) {
  v1::DecodeQuery nope = HeadQuery();
  *nope.mutable_head()->mutable_q_nope() = Bf16Zeros({4, 128});
  EXPECT_EQ(Parse(WithSecond(nope)).message(),
            "queries[1].head.q_nope: shape [4,128] has 2 dimensions, not 3");
  v1::DecodeQuery rows = LatentQuery();
  *rows.mutable_append_rows() = Bf16Zeros({1, 2, 576});
  rows.set_append_position(0);
  EXPECT_EQ(Parse(WithSecond(rows)).message(),
            "queries[1].append_rows: shape [1,2,576] has 3 dimensions, not 2");
}

TEST_F(DecodeCodecTest, WrongDtypeAndByteLengthNameTheTensor) {
  v1::DecodeQuery dtype = LatentQuery();
  dtype.mutable_latent()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(std::string(Parse(WithSecond(dtype)).message()),
              StartsWith("queries[1].latent: dtype"));
  v1::DecodeQuery bytes = LatentQuery();
  bytes.mutable_latent()->mutable_data()->pop_back();
  const absl::Status status = Parse(WithSecond(bytes));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              StartsWith("queries[1].latent: 4607 bytes != 2304 elements"));
}

}  // namespace
}  // namespace mlaserve::service
