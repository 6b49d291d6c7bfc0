#include "server/service/decode_answers.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "kernels/core/float16.h"
#include "server/engine/kv/client_id.h"
#include "server/service/wire_message.h"
#include "tests/server/service/mock_engine.h"

namespace mlaserve::service {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::SmallEngineInfo;

// A call of `queries` head-space or latent queries (4 heads, sq 2) with answers of made-up
// values: what the engine would hand the service.
class DecodeAnswersTest : public ::testing::Test {
 protected:
  void MakeCall(DecodeForm form, int queries, engine::QuerySpace space, v1::DType output,
                ElementType answer_type) {
    call_.form = form;
    call_.output_dtype = output;
    const int width = space == engine::QuerySpace::kHead ? info_.model.dv : info_.model.dl;
    q_.assign(2 * 4 * 576, Bf16());
    for (int i = 0; i < queries; ++i) {
      engine::DecodeQuery query;
      query.sq = 2;
      query.space = space;
      const auto view = *TensorView<const Bf16, 3>::Create(
          std::span<const Bf16>(q_.data(), 2 * 4 * 128), {2, 4, 128});
      if (space == engine::QuerySpace::kHead) {
        query.q_nope = view;
      } else {
        query.q_latent = view;
      }
      call_.queries.push_back(query);
      std::vector<float>& out = outs_.emplace_back(2 * 4 * width);
      std::vector<Bf16>& out_bf16 = outs_bf16_.emplace_back(out.size());
      for (size_t j = 0; j < out.size(); ++j) {
        out[j] = std::sin(static_cast<float>(j + 977 * i)) * 3.0f;
        out_bf16[j] = Bf16::FromFloat(out[j]);
      }
      std::vector<float>& lse = lses_.emplace_back(8);
      for (size_t j = 0; j < lse.size(); ++j) lse[j] = 0.25f * static_cast<float>(j + i);
      lse[3] = -std::numeric_limits<float>::infinity();
      engine::DecodeAnswer answer;
      answer.out_type = answer_type;
      answer.out = answer_type == ElementType::kFp32 ? static_cast<const void*>(out.data())
                                                     : static_cast<const void*>(out_bf16.data());
      answer.out_elements = static_cast<int64_t>(out.size());
      answer.lse = lse;
      answer.plan.formulation = engine::Formulation::kHybrid;
      answer.plan.prefix_id = "system";
      answer.plan.group_size = 40 + i;
      answer.plan.b_theta = 12.5;
      answer.plan.device = 1;
      answer.plan.batch_size = 64;
      answer.plan.device_host_ms = 2.5;
      answer.plan.naive_tokens = 1024;
      answers_.push_back(answer);
    }
  }

  void Reset() {
    call_ = ParsedDecode();
    outs_.clear();
    lses_.clear();
    outs_bf16_.clear();
    answers_.clear();
  }

  AnsweredDecode Answered(Tenant* tenant = nullptr) const {
    return AnsweredDecode{&call_, answers_, &info_.model, tenant};
  }

  // The bytes the writer produced, read back by protobuf.
  template <typename Message>
  Message ReadBack(const grpc::ByteBuffer& bytes) const {
    Message message;
    EXPECT_TRUE(ParseWireMessage(bytes, "answer", &message).ok());
    return message;
  }

  // Query i's outputs as `dtype` by each element's own rounding (an independent encoding).
  std::string Expected(size_t i, v1::DType dtype) const {
    std::string bytes;
    for (size_t j = 0; j < outs_[i].size(); ++j) {
      const float value =
          answers_[i].out_type == ElementType::kFp32 ? outs_[i][j] : outs_bf16_[i][j].ToFloat();
      uint16_t half = 0;
      switch (dtype) {
        case v1::DTYPE_FP32:
          bytes.append(reinterpret_cast<const char*>(&value), 4);
          break;
        case v1::DTYPE_FP16:
          half = Fp16::FromFloat(value).bits;
          bytes.append(reinterpret_cast<const char*>(&half), 2);
          break;
        default:
          half = Bf16::FromFloat(value).bits;
          bytes.append(reinterpret_cast<const char*>(&half), 2);
      }
    }
    return bytes;
  }
  std::string LseBytes(size_t i) const {
    return std::string(reinterpret_cast<const char*>(lses_[i].data()), lses_[i].size() * 4);
  }

  engine::EngineInfo info_ = SmallEngineInfo();
  ParsedDecode call_;
  std::vector<Bf16> q_;
  std::vector<std::vector<float>> outs_, lses_;
  std::vector<std::vector<Bf16>> outs_bf16_;
  std::vector<engine::DecodeAnswer> answers_;
};

TEST_F(DecodeAnswersTest, TheListFormCarriesEachQuerysShapesDtypesAndPlan) {
  MakeCall(DecodeForm::kList, 2, engine::QuerySpace::kHead, v1::DTYPE_FP16, ElementType::kFp32);
  absl::StatusOr<grpc::ByteBuffer> bytes = WriteDecodeResponse(Answered());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const auto response = ReadBack<v1::DecodeResponse>(*bytes);
  ASSERT_EQ(response.results_size(), 2);
  EXPECT_FALSE(response.has_packed());
  for (int i = 0; i < 2; ++i) {
    const v1::DecodeResult& result = response.results(i);
    EXPECT_EQ(result.out().dtype(), v1::DTYPE_FP16);
    EXPECT_THAT(result.out().shape(), ElementsAre(2, 4, 128));
    EXPECT_EQ(result.out().data(), Expected(i, v1::DTYPE_FP16));
    EXPECT_EQ(result.lse().dtype(), v1::DTYPE_FP32);
    EXPECT_THAT(result.lse().shape(), ElementsAre(2, 4));
    EXPECT_EQ(result.lse().data(), LseBytes(i));
    EXPECT_EQ(result.plan().formulation(), v1::FORMULATION_HYBRID);
    EXPECT_EQ(result.plan().prefix_id(), "system");
    EXPECT_EQ(result.plan().group_size(), 40 + i);
    EXPECT_EQ(result.plan().b_theta(), 12.5);
    EXPECT_EQ(result.plan().naive_tokens(), 1024);
    EXPECT_EQ(result.plan().device(), 1);
    EXPECT_EQ(result.plan().batch_size(), 64);
    EXPECT_EQ(result.plan().device_host_us(), 2500.0);
  }
}

TEST_F(DecodeAnswersTest, ThePackedFormStacksEveryQuerysAnswersInEachDtype) {
  for (const v1::DType dtype : {v1::DTYPE_BF16, v1::DTYPE_FP16, v1::DTYPE_FP32}) {
    for (const ElementType from : {ElementType::kBf16, ElementType::kFp32}) {
      SCOPED_TRACE(absl::StrCat(v1::DType_Name(dtype), " from ", static_cast<int>(from)));
      Reset();
      MakeCall(DecodeForm::kPacked, 3, engine::QuerySpace::kLatent, dtype, from);
      absl::StatusOr<grpc::ByteBuffer> bytes = WriteDecodeResponse(Answered());
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      const auto response = ReadBack<v1::DecodeResponse>(*bytes);
      EXPECT_EQ(response.results_size(), 0);
      const v1::PackedResults& packed = response.packed();
      EXPECT_EQ(packed.out().dtype(), dtype);
      EXPECT_THAT(packed.out().shape(), ElementsAre(3, 2, 4, 512));
      EXPECT_EQ(packed.out().data(), Expected(0, dtype) + Expected(1, dtype) + Expected(2, dtype));
      EXPECT_THAT(packed.lse().shape(), ElementsAre(3, 2, 4));
      EXPECT_EQ(packed.lse().data(), LseBytes(0) + LseBytes(1) + LseBytes(2));
      ASSERT_EQ(packed.plans_size(), 3);
      EXPECT_EQ(packed.plans(2).group_size(), 42);
    }
  }
}

TEST_F(DecodeAnswersTest, EncodedOutputsMatchWhatProtobufWouldHaveBuilt) {
  MakeCall(DecodeForm::kPacked, 2, engine::QuerySpace::kHead, v1::DTYPE_BF16, ElementType::kBf16);
  absl::StatusOr<grpc::ByteBuffer> bytes = WriteDecodeResponse(Answered());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  v1::DecodeResponse built;
  v1::PackedResults& packed = *built.mutable_packed();
  packed.mutable_out()->set_dtype(v1::DTYPE_BF16);
  for (const int64_t d : {2, 2, 4, 128}) packed.mutable_out()->add_shape(d);
  packed.mutable_out()->set_data(Expected(0, v1::DTYPE_BF16) + Expected(1, v1::DTYPE_BF16));
  packed.mutable_lse()->set_dtype(v1::DTYPE_FP32);
  for (const int64_t d : {2, 2, 4}) packed.mutable_lse()->add_shape(d);
  packed.mutable_lse()->set_data(LseBytes(0) + LseBytes(1));
  for (const engine::DecodeAnswer& answer : answers_) {
    *packed.add_plans() = WirePlan(answer.plan, nullptr);
  }
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(built, ReadBack<v1::DecodeResponse>(*bytes))) << diff;
  // Same bytes too, as protobuf writes fields in number order.
  grpc::ByteBuffer serialized;
  SerializeWireMessage(built, &serialized);
  grpc::Slice ours, theirs;
  ASSERT_TRUE(bytes->DumpToSingleSlice(&ours).ok());
  ASSERT_TRUE(serialized.DumpToSingleSlice(&theirs).ok());
  EXPECT_EQ(std::string(ours.begin(), ours.end()), std::string(theirs.begin(), theirs.end()));
}

TEST_F(DecodeAnswersTest, AStreamAnswerCarriesItsRequestIdAndAnOkStatus) {
  MakeCall(DecodeForm::kList, 1, engine::QuerySpace::kLatent, v1::DTYPE_FP32, ElementType::kFp32);
  absl::StatusOr<grpc::ByteBuffer> bytes = WriteDecodeResponse(Answered(), 1234567890123);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const auto answer = ReadBack<v1::DecodeStreamResponse>(*bytes);
  EXPECT_EQ(answer.request_id(), 1234567890123u);
  EXPECT_TRUE(answer.has_status());
  EXPECT_EQ(answer.status().code(), 0);
  ASSERT_EQ(answer.response().results_size(), 1);
  EXPECT_EQ(answer.response().results(0).out().data(), Expected(0, v1::DTYPE_FP32));
}

TEST_F(DecodeAnswersTest, PlansNamePrefixesOutsideTheTenantsNamespace) {
  MakeCall(DecodeForm::kList, 1, engine::QuerySpace::kLatent, v1::DTYPE_BF16, ElementType::kBf16);
  answers_[0].plan.prefix_id = engine::NamespacedId("acme", "system");
  Tenant tenant;
  tenant.name = "acme";
  absl::StatusOr<grpc::ByteBuffer> bytes = WriteDecodeResponse(Answered(&tenant));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(ReadBack<v1::DecodeResponse>(*bytes).results(0).plan().prefix_id(), "system");
}

TEST_F(DecodeAnswersTest, AnswersOfTheWrongSizeAreAnInternalErrorNamingTheQuery) {
  MakeCall(DecodeForm::kList, 2, engine::QuerySpace::kLatent, v1::DTYPE_BF16, ElementType::kFp32);
  answers_[1].out_elements -= 1;
  absl::StatusOr<grpc::ByteBuffer> bytes = WriteDecodeResponse(Answered());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("queries[1]"));
  answers_.pop_back();
  EXPECT_EQ(WriteDecodeResponse(Answered()).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace mlaserve::service
