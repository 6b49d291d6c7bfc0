// Every bad input over the wire against the real engine: the code, the field named, and
// nothing changed.

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class WireErrorsTest : public ::testing::Test {
 protected:
  WireErrorsTest() : server_(SmallEngineOptions(TinyModel())), rng_(std::random_device{}()) {}

  void SetUp() override {
    ASSERT_TRUE(client().CreateSequence("s").ok());
    rows_ = RandomBf16(10 * kWidth, 1.0, rng_);
    ASSERT_TRUE(client().AppendKv("s", 0, 0, Tensor2(rows_, 10, kWidth)).ok());
  }

  client::MlaServeClient& client() { return server_.client(); }
  std::vector<int32_t> Lengths(const std::string& id) {
    auto sequence = client().GetSequence(id);
    EXPECT_TRUE(sequence.ok()) << sequence.status();
    return sequence.ok() ? std::vector<int32_t>(sequence->layer_lengths().begin(),
                                                sequence->layer_lengths().end())
                         : std::vector<int32_t>{};
  }
  v1::DecodeQuery Latent(const std::string& id) {
    return client::LatentQuery(id, 0, 1,
                               Tensor3(RandomBf16(16 * kWidth, 1.0, rng_), 1, 16, kWidth));
  }

  static constexpr int kWidth = 576;
  IntegrationServer server_;
  Rng rng_;
  std::vector<Bf16> rows_;
};

TEST_F(WireErrorsTest, MalformedDecodesAreInvalidAndAppendNothing) {
  struct Case {
    std::string name;
    std::function<void(v1::DecodeRequest&)> spoil;
    std::string message_prefix;
  };
  const std::vector<Case> cases{
      {"empty batch", [](v1::DecodeRequest& r) { r.clear_queries(); }, "queries: empty"},
      {"oversized batch",
       [this](v1::DecodeRequest& r) {
         for (int i = 0; i < 64; ++i) *r.add_queries() = Latent("s");
       },
       "queries: 65 queries exceed limits.max_batch = 64"},
      {"wrong dtype",
       [](v1::DecodeRequest& r) {
         r.mutable_queries(0)->mutable_latent()->set_dtype(static_cast<v1::DType>(4));
       },
       "queries[0].latent: dtype"},
      {"wrong shape",
       [](v1::DecodeRequest& r) {
         r.mutable_queries(0)->mutable_latent()->set_shape(0, 2);  // as many elements, for sq 2
         r.mutable_queries(0)->mutable_latent()->set_shape(1, 8);
       },
       "queries[0].latent: shape [2,8,576] != [1,8,576]"},
      {"wrong rank",
       [](v1::DecodeRequest& r) {
         r.mutable_queries(0)->mutable_latent()->mutable_shape()->RemoveLast();
       },
       "queries[0].latent: shape [1,16] has 2 dimensions, not 3"},
      {"NaN in q",
       [](v1::DecodeRequest& r) {
         std::string& data = *r.mutable_queries(0)->mutable_latent()->mutable_data();
         data[10] = static_cast<char>(0xc0);
         data[11] = static_cast<char>(0xff);
       },
       "queries[0].latent: element 5 is NaN"},
      {"append without position",
       [](v1::DecodeRequest& r) { r.mutable_queries(0)->clear_append_position(); },
       "queries[0].append_position: missing"},
      {"position without append",
       [](v1::DecodeRequest& r) { r.mutable_queries(0)->clear_append_rows(); },
       "queries[0].append_rows: missing"},
      {"duplicate", [this](v1::DecodeRequest& r) { *r.add_queries() = Latent("s"); },
       "queries[1]: sequence 's' layer 0 appears twice"},
      {"byte length",
       [](v1::DecodeRequest& r) {
         r.mutable_queries(0)->mutable_latent()->mutable_data()->resize(100);
       },
       "queries[0].latent: 100 bytes != 9216 elements"},
      {"infinity in q",
       [](v1::DecodeRequest& r) {
         std::string& data = *r.mutable_queries(0)->mutable_latent()->mutable_data();
         data[0] = static_cast<char>(0x80);
         data[1] = static_cast<char>(0xff);  // bf16 -inf
       },
       "queries[0].latent: element 0 is infinite"},
      {"layer", [](v1::DecodeRequest& r) { r.mutable_queries(0)->set_layer(2); },
       "queries[0].layer: 2 is outside [0, 2)"},
      {"sq", [](v1::DecodeRequest& r) { r.mutable_queries(0)->set_sq(0); },
       "queries[0].sq: 0 is outside [1, 2]"},
      {"negative scale", [](v1::DecodeRequest& r) { r.set_softmax_scale(-0.5f); },
       "softmax_scale: -0.5 is not a positive finite number"},
      {"zero scale", [](v1::DecodeRequest& r) { r.set_softmax_scale(0); },
       "softmax_scale: 0 is not a positive finite number"},
      {"infinite scale",
       [](v1::DecodeRequest& r) { r.set_softmax_scale(std::numeric_limits<float>::infinity()); },
       "softmax_scale: inf is not a positive finite number"},
  };
  for (const Case& c : cases) {
    v1::DecodeRequest request;
    *request.add_queries() = Latent("s");
    client::AppendBeforeDecode(*request.mutable_queries(0),
                               Tensor2(RandomBf16(kWidth, 1.0, rng_), 1, kWidth), 10);
    c.spoil(request);
    const auto response = client().DecodeRaw(request);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(response.status().message()), StartsWith(c.message_prefix)) << c.name;
    EXPECT_THAT(Lengths("s"), ElementsAre(10, 0)) << c.name;
  }
}

TEST_F(WireErrorsTest, UnknownIdsAreNotFound) {
  EXPECT_EQ(client().Decode({Latent("ghost")}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().GetSequence("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().ForkSequence("ghost", "g2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().CreateSequence("t", "no-such-prefix").status().code(),
            absl::StatusCode::kNotFound);
  const absl::Status append =
      client().AppendKv("ghost", 0, 0, Tensor2(RandomBf16(kWidth, 1.0, rng_), 1, kWidth));
  EXPECT_EQ(append.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(append.message()), StartsWith("chunks[0]: "));
}

TEST_F(WireErrorsTest, ReusingAnIdForSomethingElseIsAlreadyExistsAndRetriesAreHarmless) {
  const std::vector<Bf16> latent = RandomBf16(2 * 3 * kWidth, 1.0, rng_);
  ASSERT_TRUE(client().RegisterPrefix("p", "", Tensor3(latent, 2, 3, kWidth)).ok());
  EXPECT_TRUE(client().RegisterPrefix("p", "", Tensor3(latent, 2, 3, kWidth)).ok());  // retry
  std::vector<Bf16> other = latent;
  other[5] = Bf16::FromFloat(other[5].ToFloat() + 1.0f);
  EXPECT_EQ(client().RegisterPrefix("p", "", Tensor3(other, 2, 3, kWidth)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(client().CreateSequence("s").ok());  // retry of SetUp's create
  EXPECT_EQ(client().CreateSequence("s", "p").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(client().ForkSequence("s", "f").ok());
  EXPECT_TRUE(client().ForkSequence("s", "f").ok());  // retry
  ASSERT_TRUE(client().CreateSequence("s2").ok());
  EXPECT_EQ(client().ForkSequence("s2", "f").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(client().ForkSequence("no-such-source", "f2").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(client().ReleaseSequence("f").ok());
  EXPECT_TRUE(client().ReleaseSequence("f").ok());  // retry
}

TEST_F(WireErrorsTest, AppendsAreIdempotentByPositionAndAGapIsAFailedPrecondition) {
  // Rows 0..9 again: a retry, no effect.
  EXPECT_TRUE(client().AppendKv("s", 0, 0, Tensor2(rows_, 10, kWidth)).ok());
  EXPECT_THAT(Lengths("s"), ElementsAre(10, 0));
  const absl::Status gap =
      client().AppendKv("s", 0, 12, Tensor2(RandomBf16(kWidth, 1.0, rng_), 1, kWidth));
  EXPECT_EQ(gap.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(gap.message()), HasSubstr("10"));  // names the expected position
  EXPECT_THAT(Lengths("s"), ElementsAre(10, 0));
}

TEST_F(WireErrorsTest, ADecodeWithAnAppendIsIdempotentThroughItsPosition) {
  v1::DecodeQuery query = Latent("s");
  client::AppendBeforeDecode(query, Tensor2(RandomBf16(kWidth, 1.0, rng_), 1, kWidth), 10);
  auto first = client().Decode({query}, v1::DTYPE_FP32);
  ASSERT_TRUE(first.ok()) << first.status();
  auto retry = client().Decode({query}, v1::DTYPE_FP32);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_THAT(Lengths("s"), ElementsAre(11, 0));
  EXPECT_EQ((*first)[0].out, (*retry)[0].out);
  EXPECT_EQ((*first)[0].lse, (*retry)[0].lse);
}

// A retry must resend what it sent: rows that differ from the stored ones are refused naming
// the token, whether an AppendKv chunk or a Decode's appended row carries them, and the
// answers afterwards are those of the stored rows; a chunk straddling the end appends the rest.
TEST_F(WireErrorsTest, ARetryWithOtherRowsIsAlreadyExistsAndChangesNothing) {
  v1::DecodeQuery query = Latent("s");
  auto before = client().Decode({query}, v1::DTYPE_FP32);
  ASSERT_TRUE(before.ok()) << before.status();

  std::vector<Bf16> other(rows_.begin() + 4 * kWidth, rows_.begin() + 6 * kWidth);
  other[kWidth + 3] = Bf16::FromBits(other[kWidth + 3].bits ^ 0x8000);  // token 5, sign flipped
  const absl::Status chunk = client().AppendKv("s", 0, 4, Tensor2(other, 2, kWidth));
  EXPECT_EQ(chunk.code(), absl::StatusCode::kAlreadyExists) << chunk;
  EXPECT_THAT(std::string(chunk.message()), HasSubstr("layer 0 already holds token 5"));

  v1::DecodeQuery with_row = Latent("s");
  const std::vector<Bf16> row5(other.begin() + kWidth, other.end());
  client::AppendBeforeDecode(with_row, Tensor2(row5, 1, kWidth), 5);
  const auto decode = client().Decode({with_row}, v1::DTYPE_FP32);
  EXPECT_EQ(decode.status().code(), absl::StatusCode::kAlreadyExists) << decode.status();
  EXPECT_THAT(Lengths("s"), ElementsAre(10, 0));
  auto after = client().Decode({query}, v1::DTYPE_FP32);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*before)[0].out, (*after)[0].out);
  EXPECT_EQ((*before)[0].lse, (*after)[0].lse);

  std::vector<Bf16> straddle(rows_.begin() + 8 * kWidth, rows_.end());
  const std::vector<Bf16> fresh = RandomBf16(3 * kWidth, 1.0, rng_);
  straddle.insert(straddle.end(), fresh.begin(), fresh.end());
  EXPECT_TRUE(client().AppendKv("s", 0, 8, Tensor2(straddle, 5, kWidth)).ok());
  EXPECT_THAT(Lengths("s"), ElementsAre(13, 0));
}

TEST(WireErrorsBudgetTest, AppendingPastTheBudgetIsResourceExhaustedAndChangesNothing) {
  engine::EngineOptions options = SmallEngineOptions(TinyModel());
  options.kv.page_size = 16;
  options.kv.budget_bytes = 8 * 16 * 576 * 2;  // eight pages
  IntegrationServer server(options);
  client::MlaServeClient& client = server.client();
  Rng rng(std::random_device{}());
  ASSERT_TRUE(client.CreateSequence("s").ok());
  ASSERT_TRUE(client.AppendKv("s", 0, 0, Tensor2(RandomBf16(100 * 576, 1.0, rng), 100, 576)).ok());
  const absl::Status status =
      client.AppendKv("s", 1, 0, Tensor2(RandomBf16(100 * 576, 1.0, rng), 100, 576));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  auto sequence = client.GetSequence("s");
  ASSERT_TRUE(sequence.ok());
  EXPECT_THAT(sequence->layer_lengths(), ElementsAre(100, 0));
}

TEST_F(WireErrorsTest, AdminListingsRefuseBadPagesNamingTheFieldAndListEverythingOnce) {
  for (int i = 0; i < 11; ++i) ASSERT_TRUE(client().CreateSequence(absl::StrCat("t", i)).ok());
  struct Case {
    absl::Status status;
    const char* field;
  };
  const std::string long_id(1025, 'x');
  const Case cases[] = {
      {client().ListSequences(-1).status(), "page_size"},
      {client().ListPrefixes(1001).status(), "page_size"},
      {client().ListSequences(5, long_id).status(), "page_token"},
      {client().ListPrefixes(5, long_id).status(), "page_token"},
      {client().ListSequences(5, "", long_id).status(), "prefix_id"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
    EXPECT_THAT(std::string(c.status.message()), StartsWith(c.field));
  }
  // Pages of 5 list the 12 sequences ("s" and t0..t10) once each, in id order.
  std::vector<std::string> listed;
  std::string token;
  for (int page = 0; page < 10; ++page) {
    absl::StatusOr<v1::ListSequencesResponse> answer = client().ListSequences(5, token);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_LE(answer->sequences_size(), 5);
    for (const v1::SequenceSummary& s : answer->sequences()) {
      listed.push_back(s.sequence().sequence_id());
    }
    token = answer->next_page_token();
    if (token.empty()) break;
  }
  std::vector<std::string> expected = {"s"};
  for (int i = 0; i < 11; ++i) expected.push_back(absl::StrCat("t", i));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(listed, expected);
  absl::StatusOr<v1::ListSequencesResponse> first = client().ListSequences(1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->sequences(0).sequence().layer_lengths(0), 10);
  EXPECT_EQ(first->sequences(0).pages(), 1);  // 10 tokens in one 32-token page
  absl::StatusOr<v1::GetStatsResponse> stats = client().GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->sequences(), 12);
  EXPECT_EQ(stats->kv_pages_used(), 1);
  EXPECT_EQ(stats->tenant(), "");
}

}  // namespace
}  // namespace mlaserve::integration
