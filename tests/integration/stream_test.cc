// DecodeStream against the real engine: many requests in flight on one stream, answered by
// id in completion order, a bad request answered in-band while the others succeed.

#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

TEST(StreamTest, ManyRequestsOnOneStreamEachAnsweredByIdWithErrorsInBand) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  const engine::ModelConfig& model = server.model();
  const int width = model.dk_latent();
  Rng rng(std::random_device{}());
  constexpr int kSequences = 5;
  std::vector<std::vector<Bf16>> rows(kSequences);
  for (int s = 0; s < kSequences; ++s) {
    const std::string id = absl::StrCat("s", s);
    ASSERT_TRUE(server.client().CreateSequence(id).ok());
    rows[s] = RandomBf16(static_cast<size_t>(10 + 7 * s) * width, 1.0, rng);
    ASSERT_TRUE(server.client().AppendKv(id, 1, 0, Tensor2(rows[s], 10 + 7 * s, width)).ok());
  }
  auto stream = server.client().OpenDecodeStream(absl::Seconds(30));
  std::map<uint64_t, GoldenOutput> goldens;
  constexpr uint64_t kBadId = 1000;
  for (int round = 0; round < 3; ++round) {
    for (int s = 0; s < kSequences; ++s) {
      const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng);
      v1::DecodeRequest request;
      *request.add_queries() =
          client::LatentQuery(absl::StrCat("s", s), 1, 1, Tensor3(q, 1, model.heads, width));
      request.set_output_dtype(v1::DTYPE_FP32);
      const uint64_t id = 10 * round + s;
      goldens[id] = GoldenLatent(model, rows[s], q, 1);
      ASSERT_TRUE(stream->Send(id, request));
    }
    if (round == 1) {
      v1::DecodeRequest bad;
      *bad.add_queries() = client::LatentQuery(
          "no-such-sequence", 1, 1,
          Tensor3(RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng), 1, model.heads,
                  width));
      ASSERT_TRUE(stream->Send(kBadId, bad));
    }
  }
  ASSERT_TRUE(stream->WritesDone());
  std::map<uint64_t, v1::DecodeStreamResponse> answers;
  while (auto answer = stream->Receive()) {
    EXPECT_EQ(answers.count(answer->request_id()), 0u) << "answered twice";
    answers[answer->request_id()] = *std::move(answer);
  }
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(answers.size(), goldens.size() + 1);
  EXPECT_EQ(answers[kBadId].status().code(), static_cast<int>(absl::StatusCode::kNotFound));
  for (const auto& [id, golden] : goldens) {
    SCOPED_TRACE(absl::StrCat("request ", id));
    const v1::DecodeStreamResponse& answer = answers[id];
    ASSERT_EQ(answer.status().code(), 0) << answer.status().message();
    auto outputs = client::ToDecodeOutputs(answer.response());
    ASSERT_TRUE(outputs.ok());
    EXPECT_TRUE(testing::AllClose((*outputs)[0].out, golden.out, kLatentOutTolerance, true));
    EXPECT_TRUE(testing::AllClose((*outputs)[0].lse, golden.lse, kLatentLseTolerance, false));
  }
}

}  // namespace
}  // namespace mlaserve::integration
