#include "server/service/decode_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "tests/server/service/mock_engine.h"

namespace mlaserve::service {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::SmallEngineInfo;

v1::Tensor Bf16Zeros(std::vector<int64_t> shape) {
  v1::Tensor tensor;
  tensor.set_dtype(v1::DTYPE_BF16);
  int64_t count = 1;
  for (int64_t d : shape) {
    tensor.add_shape(d);
    count *= d;
  }
  tensor.set_data(std::string(static_cast<size_t>(count) * 2, '\0'));
  return tensor;
}

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
    return ParseDecodeRequest(request, info_).status();
  }

  engine::EngineInfo info_ = SmallEngineInfo();
};

TEST_F(DecodeCodecTest, ParsesHeadAndLatentQueriesWithTheirOutputLayouts) {
  v1::DecodeRequest request;
  *request.add_queries() = HeadQuery(2);
  v1::DecodeQuery latent = LatentQuery();
  *latent.mutable_append_rows() = Bf16Zeros({3, 576});
  latent.set_append_position(17);
  *request.add_queries() = latent;
  auto parsed = ParseDecodeRequest(request, info_);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->queries.size(), 2u);
  EXPECT_EQ(parsed->output_dtype, v1::DTYPE_BF16);  // unspecified means bf16
  const engine::DecodeQuery& head = parsed->queries[0];
  EXPECT_EQ(head.space, engine::QuerySpace::kHead);
  EXPECT_EQ(head.layer, 2);
  EXPECT_EQ(head.sq, 2);
  EXPECT_EQ(head.q_nope.size(), 2u * 4 * 128);
  EXPECT_EQ(head.q_pe.size(), 2u * 4 * 64);
  EXPECT_EQ(head.append_position, -1);
  EXPECT_EQ(parsed->layouts[0].width, 128);  // dv
  const engine::DecodeQuery& lat = parsed->queries[1];
  EXPECT_EQ(lat.space, engine::QuerySpace::kLatent);
  EXPECT_EQ(lat.q_latent.size(), 4u * 576);
  EXPECT_EQ(lat.append_rows.size(), 3u * 576);
  EXPECT_EQ(lat.append_position, 17);
  EXPECT_EQ(parsed->layouts[1].width, 512);  // dl
}

TEST_F(DecodeCodecTest, AnEmptyBatchIsInvalid) {
  const absl::Status status = Parse(v1::DecodeRequest());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("queries: empty"));
}

TEST_F(DecodeCodecTest, ABatchLargerThanMaxBatchIsInvalid) {
  v1::DecodeRequest request;
  for (int i = 0; i <= info_.max_batch; ++i) *request.add_queries() = HeadQuery();
  const absl::Status status = Parse(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("queries: 9 queries exceed limits.max_batch = 8"));
}

TEST_F(DecodeCodecTest, AnUnknownOutputDtypeIsInvalid) {
  v1::DecodeRequest request = WithSecond(HeadQuery());
  request.set_output_dtype(static_cast<v1::DType>(9));
  const absl::Status status = Parse(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("output_dtype: 9"));
}

TEST_F(DecodeCodecTest, AnEmptySequenceIdIsInvalid) {
  v1::DecodeQuery query = HeadQuery();
  query.clear_sequence_id();
  EXPECT_EQ(Parse(WithSecond(query)).message(), "queries[1].sequence_id: empty");
}

TEST_F(DecodeCodecTest, ALayerOutOfRangeIsInvalid) {
  for (int layer : {-1, 3}) {
    v1::DecodeQuery query = HeadQuery();
    query.set_layer(layer);
    const absl::Status status = Parse(WithSecond(query));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), absl::StrCat("queries[1].layer: ", layer, " is outside [0, 3)"));
  }
}

TEST_F(DecodeCodecTest, AnSqOutOfRangeIsInvalid) {
  for (int sq : {0, 3}) {
    v1::DecodeQuery query = HeadQuery();
    query.set_sq(sq);
    const absl::Status status = Parse(WithSecond(query));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), StartsWith(absl::StrCat("queries[1].sq: ", sq,
                                                          " is outside [1, 2]")));
  }
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

TEST_F(DecodeCodecTest, WrongShapesNameTheTensor) {
  v1::DecodeQuery nope = HeadQuery();
  *nope.mutable_head()->mutable_q_nope() = Bf16Zeros({1, 4, 64});
  EXPECT_EQ(Parse(WithSecond(nope)).message(),
            "queries[1].head.q_nope: shape [1,4,64] != [1,4,128]");
  v1::DecodeQuery heads = HeadQuery();
  *heads.mutable_head()->mutable_q_pe() = Bf16Zeros({1, 8, 64});
  EXPECT_EQ(Parse(WithSecond(heads)).message(), "queries[1].head.q_pe: shape [1,8,64] != [1,4,64]");
  v1::DecodeQuery sq = LatentQuery(1);
  *sq.mutable_latent() = Bf16Zeros({2, 4, 576});
  EXPECT_EQ(Parse(WithSecond(sq)).message(), "queries[1].latent: shape [2,4,576] != [1,4,576]");
  v1::DecodeQuery rows = LatentQuery();
  *rows.mutable_append_rows() = Bf16Zeros({2, 512});
  rows.set_append_position(0);
  EXPECT_EQ(Parse(WithSecond(rows)).message(),
            "queries[1].append_rows: shape [2,512] != [n,576]");
}

TEST_F(DecodeCodecTest, WrongDtypeAndByteLengthNameTheTensor) {
  v1::DecodeQuery dtype = LatentQuery();
  dtype.mutable_latent()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(std::string(Parse(WithSecond(dtype)).message()), StartsWith("queries[1].latent: dtype"));
  v1::DecodeQuery bytes = LatentQuery();
  bytes.mutable_latent()->mutable_data()->pop_back();
  const absl::Status status = Parse(WithSecond(bytes));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("queries[1].latent: 4607 bytes != 2304 elements"));
}

TEST_F(DecodeCodecTest, NanInQIsInvalid) {
  v1::DecodeQuery query = HeadQuery();
  std::string& data = *query.mutable_head()->mutable_q_nope()->mutable_data();
  data[2 * 77] = static_cast<char>(0xc0);  // 0x7fc0: bf16 NaN at element 77
  data[2 * 77 + 1] = 0x7f;
  EXPECT_EQ(Parse(WithSecond(query)).message(),
            "queries[1].head.q_nope: element 77 is NaN; inputs must be finite");
}

TEST_F(DecodeCodecTest, AppendRowsAndPositionGoTogether) {
  v1::DecodeQuery rows_only = LatentQuery();
  *rows_only.mutable_append_rows() = Bf16Zeros({1, 576});
  EXPECT_THAT(std::string(Parse(WithSecond(rows_only)).message()),
              StartsWith("queries[1].append_position: missing"));
  v1::DecodeQuery position_only = LatentQuery();
  position_only.set_append_position(3);
  EXPECT_THAT(std::string(Parse(WithSecond(position_only)).message()),
              StartsWith("queries[1].append_rows: missing"));
  v1::DecodeQuery negative = LatentQuery();
  *negative.mutable_append_rows() = Bf16Zeros({1, 576});
  negative.set_append_position(-4);
  EXPECT_EQ(Parse(WithSecond(negative)).message(), "queries[1].append_position: -4 is negative");
}

TEST_F(DecodeCodecTest, FillsResultsWithShapesDtypesAndPlans) {
  std::vector<AnswerLayout> layouts{{2, 4, 128}};
  engine::DecodeAnswer answer;
  answer.out.assign(2 * 4 * 128, 0.5f);
  answer.lse.assign(8, 1.25f);
  answer.lse[3] = -std::numeric_limits<float>::infinity();
  answer.plan.formulation = engine::Formulation::kHybrid;
  answer.plan.prefix_id = "system";
  answer.plan.group_size = 40;
  answer.plan.b_theta = 12.5;
  answer.plan.device = 1;
  answer.plan.batch_size = 64;
  answer.plan.queue_us = 12;
  answer.plan.device_modeled_us = 30;
  answer.plan.device_host_ms = 2.5;
  v1::DecodeResponse response;
  ASSERT_TRUE(FillDecodeResponse(layouts, v1::DTYPE_FP16, {answer}, &response).ok());
  ASSERT_EQ(response.results_size(), 1);
  const v1::DecodeResult& result = response.results(0);
  EXPECT_EQ(result.out().dtype(), v1::DTYPE_FP16);
  EXPECT_THAT(result.out().shape(), ::testing::ElementsAre(2, 4, 128));
  EXPECT_EQ(result.out().data().size(), 2u * 4 * 128 * 2);
  EXPECT_EQ(result.lse().dtype(), v1::DTYPE_FP32);
  EXPECT_THAT(result.lse().shape(), ::testing::ElementsAre(2, 4));
  float lse3;
  std::memcpy(&lse3, result.lse().data().data() + 12, 4);
  EXPECT_TRUE(std::isinf(lse3) && lse3 < 0);
  EXPECT_EQ(result.plan().formulation(), v1::FORMULATION_HYBRID);
  EXPECT_EQ(result.plan().prefix_id(), "system");
  EXPECT_EQ(result.plan().group_size(), 40);
  EXPECT_EQ(result.plan().b_theta(), 12.5);
  EXPECT_EQ(result.plan().device(), 1);
  EXPECT_EQ(result.plan().batch_size(), 64);
  EXPECT_EQ(result.plan().device_host_us(), 2500.0);
}

TEST_F(DecodeCodecTest, AnswersOfTheWrongSizeAreAnInternalError) {
  std::vector<AnswerLayout> layouts{{1, 4, 512}};
  engine::DecodeAnswer answer;
  answer.out.assign(4 * 511, 0.0f);
  answer.lse.assign(4, 0.0f);
  v1::DecodeResponse response;
  const absl::Status status = FillDecodeResponse(layouts, v1::DTYPE_BF16, {answer}, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(status.message()), HasSubstr("queries[0]"));
  EXPECT_EQ(FillDecodeResponse(layouts, v1::DTYPE_BF16, {}, &response).code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace mlaserve::service
