// The packed form of Decode (one layer's queries of B sequences as stacked tensors) through
// the real server: answers against the fp64 golden and bit for bit the list form's, bad
// batches named by their packed fields and changing nothing, and the stream.

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/batch_scenario.h"

namespace mlaserve::integration {
namespace {

using ::testing::StartsWith;

class PackedBatchTest : public ::testing::TestWithParam<engine::QuerySpace> {
 protected:
  IntegrationServer server_{SmallEngineOptions(TinyModel())};
  Rng rng_{std::random_device{}()};
};

TEST_P(PackedBatchTest, AnswersMatchTheGoldenAndTheListFormBitForBit) {
  BatchScenario scenario(server_.client(), server_.model(), "packed", 5, GetParam(), 2, 2, rng_);
  const client::DecodeBatchRequest fp32 = scenario.WithOutput(v1::DTYPE_FP32);
  client::DecodeBatchBuffers packed(fp32, scenario.width());
  ASSERT_TRUE(server_.client().DecodeBatch(fp32, packed.output).ok());
  scenario.ExpectGolden(packed.out, packed.lse);
  ASSERT_EQ(packed.output.plans.size(), 5u);
  // The same queries as a list (the appends are there already: a retry of them is a no-op).
  absl::StatusOr<v1::DecodeResponse> listed =
      server_.client().DecodeRaw(client::ListDecodeRequest(fp32, 0, 5));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->results_size(), 5);
  const size_t per_out = packed.out.size() / 5, per_lse = packed.lse.size() / 5;
  for (int b = 0; b < 5; ++b) {
    const v1::DecodeResult& result = listed->results(b);
    ASSERT_EQ(result.out().data().size(), per_out);
    EXPECT_EQ(std::memcmp(result.out().data().data(), packed.out.data() + b * per_out, per_out), 0)
        << "sequence " << b;
    EXPECT_EQ(std::memcmp(result.lse().data().data(), packed.lse.data() + b * per_lse,
                          per_lse * sizeof(float)),
              0);
    EXPECT_EQ(result.plan().formulation(), packed.output.plans[b].formulation());
  }
  // bf16 answers are fp32's rounded, as the list form's are.
  client::DecodeBatchBuffers bf16(scenario.request(), scenario.width());
  ASSERT_TRUE(server_.client().DecodeBatch(scenario.request(), bf16.output).ok());
  EXPECT_EQ(bf16.out.size(), packed.out.size() / 2);
}

TEST_P(PackedBatchTest, ABadBatchIsNamedByItsPackedFieldAndChangesNothing) {
  BatchScenario scenario(server_.client(), server_.model(), "bad", 3, GetParam(), 1, 1, rng_);
  const std::vector<int64_t> before = scenario.Lengths(server_.client());
  client::DecodeBatchRequest request = scenario.request();
  // A NaN in sequence 2's query: refused as a whole, its appends and the others' undone.
  client::BatchTensor& q = request.head_space() ? request.q_nope : request.latent;
  std::vector<Bf16> poisoned(static_cast<const Bf16*>(q.data),
                             static_cast<const Bf16*>(q.data) + q.elements());
  poisoned[poisoned.size() - 3] = Bf16::FromFloat(std::nanf(""));
  q.data = poisoned.data();
  client::DecodeBatchBuffers buffers(request, scenario.width());
  absl::Status status = server_.client().DecodeBatch(request, buffers.output);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              StartsWith(request.head_space() ? "packed.head.q_nope[2]: element"
                                              : "packed.latent[2]: element"));
  EXPECT_EQ(scenario.Lengths(server_.client()), before);

  request = scenario.request();
  request.sequence_ids[1] = "bad/nobody";
  status = server_.client().DecodeBatch(request, buffers.output);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), StartsWith("packed.sequence_ids[1]: 'bad/nobody'"));
  EXPECT_EQ(scenario.Lengths(server_.client()), before);

  request = scenario.request();
  request.layer = 7;
  status = server_.client().DecodeBatch(request, buffers.output);
  EXPECT_THAT(std::string(status.message()), StartsWith("packed.layer: 7 is outside"));

  // The client's own check, before anything is sent.
  request = scenario.request();
  request.append_positions.pop_back();
  status = server_.client().DecodeBatch(request, buffers.output);
  EXPECT_THAT(std::string(status.message()), StartsWith("append_positions: want 3 positions"));
  EXPECT_EQ(scenario.Lengths(server_.client()), before);

  // The answers' memory must fit them.
  request = scenario.request();
  std::vector<std::byte> small(buffers.out.size() - 2);
  client::DecodeBatchOutput wrong{small, buffers.lse, {}};
  status = server_.client().DecodeBatch(request, wrong);
  EXPECT_THAT(std::string(status.message()), StartsWith("out: "));
}

TEST_P(PackedBatchTest, AStreamAnswersAPackedRequestInThePackedForm) {
  BatchScenario scenario(server_.client(), server_.model(), "stream", 4, GetParam(), 1, 1, rng_);
  const client::DecodeBatchRequest fp32 = scenario.WithOutput(v1::DTYPE_FP32);
  std::unique_ptr<client::DecodeStream> stream = server_.client().OpenDecodeStream();
  ASSERT_TRUE(stream->Send(42, client::PackedDecodeRequest(fp32, 0, 4)));
  std::optional<v1::DecodeStreamResponse> answer = stream->Receive();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->request_id(), 42u);
  EXPECT_EQ(answer->status().code(), 0) << answer->status().message();
  client::DecodeBatchBuffers buffers(fp32, scenario.width());
  ASSERT_TRUE(
      client::ReadBatchAnswers(fp32, *answer->mutable_response(), 0, 4, buffers.output).ok());
  scenario.ExpectGolden(buffers.out, buffers.lse);
  stream->WritesDone();
  while (stream->Receive().has_value()) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

INSTANTIATE_TEST_SUITE_P(Spaces, PackedBatchTest,
                         ::testing::Values(engine::QuerySpace::kHead, engine::QuerySpace::kLatent),
                         [](const auto& param_info) {
                           return param_info.param == engine::QuerySpace::kHead ? "Head" : "Latent";
                         });

}  // namespace
}  // namespace mlaserve::integration
