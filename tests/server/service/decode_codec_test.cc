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

// The answers go out straight from the engine's buffers, in the dtype asked for.
TEST_F(DecodeCodecTest, FillsResultsWithShapesDtypesAndPlans) {
  engine::DecodeQuery query;
  query.sq = 2;
  query.space = engine::QuerySpace::kHead;
  // The answer's shape follows q's heads (4 here).
  const std::vector<Bf16> q_nope(2 * 4 * 128);
  query.q_nope = *TensorView<const Bf16, 3>::Create(std::span<const Bf16>(q_nope), {2, 4, 128});
  std::vector<float> out(2 * 4 * 128, 0.5f);
  std::vector<float> lse(8, 1.25f);
  lse[3] = -std::numeric_limits<float>::infinity();
  engine::DecodeAnswer answer;
  answer.out_type = ElementType::kFp32;
  answer.out = out.data();
  answer.out_elements = static_cast<int64_t>(out.size());
  answer.lse = lse;
  answer.plan.formulation = engine::Formulation::kHybrid;
  answer.plan.prefix_id = "system";
  answer.plan.group_size = 40;
  answer.plan.b_theta = 12.5;
  answer.plan.naive_tokens = 1024;
  answer.plan.naive_pass_query_tokens = 72;
  answer.plan.device = 1;
  answer.plan.batch_size = 64;
  answer.plan.queue_us = 12;
  answer.plan.device_modeled_us = 30;
  answer.plan.device_host_ms = 2.5;
  v1::DecodeResponse response;
  ASSERT_TRUE(
      FillDecodeResponse({&query, 1}, info_.model, v1::DTYPE_FP16, {&answer, 1}, &response).ok());
  ASSERT_EQ(response.results_size(), 1);
  const v1::DecodeResult& result = response.results(0);
  EXPECT_EQ(result.out().dtype(), v1::DTYPE_FP16);
  EXPECT_THAT(result.out().shape(), ::testing::ElementsAre(2, 4, 128));
  EXPECT_EQ(result.out().data().size(), 2u * 4 * 128 * 2);
  uint16_t half;
  std::memcpy(&half, result.out().data().data(), 2);
  EXPECT_EQ(half, 0x3800);  // 0.5 in fp16
  EXPECT_EQ(result.lse().dtype(), v1::DTYPE_FP32);
  EXPECT_THAT(result.lse().shape(), ::testing::ElementsAre(2, 4));
  float lse3;
  std::memcpy(&lse3, result.lse().data().data() + 12, 4);
  EXPECT_TRUE(std::isinf(lse3) && lse3 < 0);
  EXPECT_EQ(result.plan().formulation(), v1::FORMULATION_HYBRID);
  EXPECT_EQ(result.plan().prefix_id(), "system");
  EXPECT_EQ(result.plan().group_size(), 40);
  EXPECT_EQ(result.plan().b_theta(), 12.5);
  EXPECT_EQ(result.plan().naive_tokens(), 1024);
  EXPECT_EQ(result.plan().naive_pass_query_tokens(), 72);
  EXPECT_EQ(result.plan().device(), 1);
  EXPECT_EQ(result.plan().batch_size(), 64);
  EXPECT_EQ(result.plan().device_host_us(), 2500.0);
}

TEST_F(DecodeCodecTest, Bf16AnswersAreCopiedAsTheyAreAndWidenedOnRequest) {
  engine::DecodeQuery query;
  query.sq = 1;
  query.space = engine::QuerySpace::kLatent;
  const std::vector<Bf16> q_latent(4 * 576);
  query.q_latent = *TensorView<const Bf16, 3>::Create(std::span<const Bf16>(q_latent), {1, 4, 576});
  std::vector<Bf16> out(4 * 512);
  for (size_t i = 0; i < out.size(); ++i) out[i] = Bf16::FromFloat(static_cast<float>(i) / 7);
  std::vector<float> lse(4, 0.0f);
  engine::DecodeAnswer answer;
  answer.out_type = ElementType::kBf16;
  answer.out = out.data();
  answer.out_elements = static_cast<int64_t>(out.size());
  answer.lse = lse;
  v1::DecodeResponse bf16, fp32;
  ASSERT_TRUE(
      FillDecodeResponse({&query, 1}, info_.model, v1::DTYPE_BF16, {&answer, 1}, &bf16).ok());
  ASSERT_TRUE(
      FillDecodeResponse({&query, 1}, info_.model, v1::DTYPE_FP32, {&answer, 1}, &fp32).ok());
  EXPECT_EQ(bf16.results(0).out().data(),
            std::string(reinterpret_cast<const char*>(out.data()), out.size() * 2));
  float x;
  std::memcpy(&x, fp32.results(0).out().data().data() + 4 * 100, 4);
  EXPECT_EQ(x, out[100].ToFloat());
}

TEST_F(DecodeCodecTest, AnswersOfTheWrongSizeAreAnInternalError) {
  engine::DecodeQuery query;
  query.sq = 1;
  query.space = engine::QuerySpace::kLatent;
  const std::vector<Bf16> q_latent(4 * 576);
  query.q_latent = *TensorView<const Bf16, 3>::Create(std::span<const Bf16>(q_latent), {1, 4, 576});
  std::vector<float> out(4 * 511, 0.0f), lse(4, 0.0f);
  engine::DecodeAnswer answer;
  answer.out = out.data();
  answer.out_elements = static_cast<int64_t>(out.size());
  answer.lse = lse;
  v1::DecodeResponse response;
  const absl::Status status =
      FillDecodeResponse({&query, 1}, info_.model, v1::DTYPE_BF16, {&answer, 1}, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(status.message()), HasSubstr("queries[0]"));
  EXPECT_EQ(FillDecodeResponse({&query, 1}, info_.model, v1::DTYPE_BF16, {}, &response).code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace mlaserve::service
