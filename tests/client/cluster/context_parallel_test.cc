#include "client/cluster/context_parallel.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tensor_helpers.h"
#include "gtest/gtest.h"

namespace mlaserve::client {
namespace {

constexpr int kHeads = 3;
constexpr int kDim = 8;    // key width
constexpr int kWidth = 5;  // value width

v1::DecodeQuery LatentQueryOf(const std::vector<float>& q, int sq) {
  const int64_t shape[] = {sq, kHeads, kDim};
  v1::DecodeQuery query;
  query.set_sequence_id("s");
  query.set_layer(1);
  query.set_sq(sq);
  *query.mutable_latent() = Fp32Tensor(q, shape);
  return query;
}

// Attention of one query row over keys [0, visible) in long double: what an exact server
// computes, as (out, lse).
void Attend(const float* q, const std::vector<float>& keys, const std::vector<float>& values,
            int64_t first, int64_t visible, long double* out, long double* lse) {
  long double max_score = -std::numeric_limits<long double>::infinity();
  std::vector<long double> scores(visible);
  for (int64_t k = 0; k < visible; ++k) {
    long double dot = 0;
    for (int d = 0; d < kDim; ++d)
      dot += static_cast<long double>(q[d]) * keys[(first + k) * kDim + d];
    scores[k] = dot * 0.3L;
    max_score = std::max(max_score, scores[k]);
  }
  long double sum = 0;
  for (int w = 0; w < kWidth; ++w) out[w] = 0;
  for (int64_t k = 0; k < visible; ++k) {
    const long double p = std::exp(scores[k] - max_score);
    sum += p;
    for (int w = 0; w < kWidth; ++w) out[w] += p * values[(first + k) * kWidth + w];
  }
  if (visible == 0) {
    *lse = -std::numeric_limits<long double>::infinity();
    return;
  }
  for (int w = 0; w < kWidth; ++w) out[w] /= sum;
  *lse = max_score + std::log(sum);
}

// A part's fp32 answer as the server gives it: bottom-right causal over the part's keys.
v1::DecodeResult ServerAnswer(const PartQuery& part_query, const SequencePart& part,
                              const std::vector<float>& keys, const std::vector<float>& values) {
  absl::StatusOr<std::vector<float>> q = TensorToFloats(part_query.query.latent());
  EXPECT_TRUE(q.ok());
  const int sq = part_query.query.sq();
  const int64_t length = part.end - part.start;
  std::vector<float> out(static_cast<size_t>(sq) * kHeads * kWidth), lse(sq * kHeads);
  for (int s = 0; s < sq; ++s) {
    for (int h = 0; h < kHeads; ++h) {
      long double o[kWidth], l;
      Attend(&(*q)[(s * kHeads + h) * kDim], keys, values, part.start, length - sq + s + 1, o, &l);
      for (int w = 0; w < kWidth; ++w)
        out[(s * kHeads + h) * kWidth + w] = static_cast<float>(o[w]);
      lse[s * kHeads + h] = static_cast<float>(l);
    }
  }
  v1::DecodeResult result;
  const int64_t out_shape[] = {sq, kHeads, kWidth};
  const int64_t lse_shape[] = {sq, kHeads};
  *result.mutable_out() = Fp32Tensor(out, out_shape);
  *result.mutable_lse() = Fp32Tensor(lse, lse_shape);
  return result;
}

struct SplitCase {
  int64_t length;
  int sq;
  std::vector<int64_t> starts;  // the parts' first positions
};

class ContextParallelTest : public ::testing::TestWithParam<SplitCase> {};

// Split, answer each part exactly, merge: the whole sequence's causal attention, to fp32
// rounding, for single tokens and MTP tokens that straddle a part boundary.
TEST_P(ContextParallelTest, MergedPartsEqualTheWholeSequencesAttention) {
  const SplitCase& c = GetParam();
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> keys(c.length * kDim), values(c.length * kWidth),
      q(static_cast<size_t>(c.sq) * kHeads * kDim);
  for (float& v : keys) v = normal(rng);
  for (float& v : values) v = normal(rng);
  for (float& v : q) v = normal(rng);
  std::vector<SequencePart> parts;
  for (size_t p = 0; p < c.starts.size(); ++p) {
    parts.push_back({absl::StrCat("s@p", p), c.starts[p],
                     p + 1 < c.starts.size() ? c.starts[p + 1] : c.length});
  }
  absl::StatusOr<std::vector<PartQuery>> split =
      SplitOverParts(LatentQueryOf(q, c.sq), c.length, parts);
  ASSERT_TRUE(split.ok()) << split.status();
  std::vector<v1::DecodeResult> answers;
  for (const PartQuery& part_query : *split) {
    EXPECT_EQ(part_query.query.sequence_id(), parts[part_query.part].sequence_id);
    EXPECT_EQ(part_query.query.layer(), 1);
    answers.push_back(ServerAnswer(part_query, parts[part_query.part], keys, values));
  }
  absl::StatusOr<v1::DecodeResult> merged = MergeByLse(c.sq, *split, answers, v1::DTYPE_FP32);
  ASSERT_TRUE(merged.ok()) << merged.status();
  absl::StatusOr<std::vector<float>> out = TensorToFloats(merged->out());
  absl::StatusOr<std::vector<float>> lse = TensorToFloats(merged->lse());
  ASSERT_TRUE(out.ok() && lse.ok());
  for (int s = 0; s < c.sq; ++s) {
    for (int h = 0; h < kHeads; ++h) {
      long double o[kWidth], l;
      Attend(&q[(s * kHeads + h) * kDim], keys, values, 0, c.length - c.sq + s + 1, o, &l);
      EXPECT_NEAR((*lse)[s * kHeads + h], l, 4e-6 * std::max(1.0L, std::fabs(l)))
          << "token " << s << " head " << h;
      for (int w = 0; w < kWidth; ++w) {
        EXPECT_NEAR((*out)[(s * kHeads + h) * kWidth + w], o[w], 2e-6)
            << "token " << s << " head " << h << " element " << w;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Splits, ContextParallelTest,
    ::testing::Values(SplitCase{40, 1, {0}}, SplitCase{40, 1, {0, 16, 32}},
                      SplitCase{40, 1, {0, 39}},
                      SplitCase{40, 3, {0, 16, 38}},  // the three tokens straddle a boundary
                      SplitCase{40, 4, {0, 37, 39}},  // a part holds only MTP tokens
                      SplitCase{40, 2, {0, 10, 20, 30}}),
    [](const ::testing::TestParamInfo<SplitCase>& case_info) {
      return absl::StrCat("L", case_info.param.length, "sq", case_info.param.sq, "parts",
                          case_info.param.starts.size(), "at", case_info.param.starts.back());
    });

TEST(SplitOverPartsTest, TokensInsideAPartGoTogetherAndTokensPastItAlone) {
  // Positions 37, 38, 39 over parts [0, 38) and [38, 40).
  std::vector<float> q(3 * kHeads * kDim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i);
  const std::vector<SequencePart> parts = {{"a", 0, 38}, {"b", 38, 40}};
  absl::StatusOr<std::vector<PartQuery>> split = SplitOverParts(LatentQueryOf(q, 3), 40, parts);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->size(), 4u);
  // Part a: token 0 inside (the part's last position), tokens 1 and 2 past it, one each.
  EXPECT_EQ((*split)[0].part, 0u);
  EXPECT_EQ((*split)[0].first_token, 0);
  EXPECT_EQ((*split)[0].query.sq(), 1);
  EXPECT_EQ((*split)[1].first_token, 1);
  EXPECT_EQ((*split)[2].first_token, 2);
  EXPECT_EQ((*split)[2].query.sq(), 1);
  // Part b: tokens 1 and 2 together, their q rows the original's.
  EXPECT_EQ((*split)[3].part, 1u);
  EXPECT_EQ((*split)[3].first_token, 1);
  EXPECT_EQ((*split)[3].query.sq(), 2);
  absl::StatusOr<std::vector<float>> sliced = TensorToFloats((*split)[3].query.latent());
  ASSERT_TRUE(sliced.ok());
  EXPECT_EQ(std::vector<float>(q.begin() + kHeads * kDim, q.end()), *sliced);
}

TEST(SplitOverPartsTest, RejectsAnAppendAndPartsThatDoNotTileTheLayer) {
  std::vector<float> q(kHeads * kDim, 1.0f);
  v1::DecodeQuery with_append = LatentQueryOf(q, 1);
  with_append.set_append_position(3);
  EXPECT_TRUE(absl::IsInvalidArgument(
      SplitOverParts(with_append, 10, std::vector<SequencePart>{{"a", 0, 10}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SplitOverParts(LatentQueryOf(q, 1), 10, std::vector<SequencePart>{{"a", 0, 4}, {"b", 5, 10}})
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SplitOverParts(LatentQueryOf(q, 1), 12, std::vector<SequencePart>{{"a", 0, 10}}).status()));
}

TEST(MergeByLseTest, ARowNoPartSawIsZeroWithMinusInfinityLse) {
  PartQuery only{0, 0, LatentQueryOf(std::vector<float>(kHeads * kDim, 0.0f), 1)};
  v1::DecodeResult answer;
  const int64_t out_shape[] = {1, kHeads, kWidth};
  const int64_t lse_shape[] = {1, kHeads};
  *answer.mutable_out() = Fp32Tensor(std::vector<float>(kHeads * kWidth, 0.0f), out_shape);
  *answer.mutable_lse() =
      Fp32Tensor(std::vector<float>(kHeads, -std::numeric_limits<float>::infinity()), lse_shape);
  absl::StatusOr<v1::DecodeResult> merged =
      MergeByLse(1, std::span<const PartQuery>(&only, 1),
                 std::span<const v1::DecodeResult>(&answer, 1), v1::DTYPE_BF16);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->out().dtype(), v1::DTYPE_BF16);
  absl::StatusOr<std::vector<float>> lse = TensorToFloats(merged->lse());
  ASSERT_TRUE(lse.ok());
  for (float value : *lse) EXPECT_TRUE(std::isinf(value) && value < 0);
}

TEST(MergeByLseTest, AnAnswerThatIsNotFp32IsInvalid) {
  PartQuery only{0, 0, LatentQueryOf(std::vector<float>(kHeads * kDim, 0.0f), 1)};
  v1::DecodeResult answer;
  const int64_t out_shape[] = {1, kHeads, kWidth};
  *answer.mutable_out() =
      FloatTensor(std::vector<float>(kHeads * kWidth, 0.0f), out_shape, v1::DTYPE_BF16);
  EXPECT_TRUE(absl::IsInvalidArgument(MergeByLse(1, std::span<const PartQuery>(&only, 1),
                                                 std::span<const v1::DecodeResult>(&answer, 1),
                                                 v1::DTYPE_BF16)
                                          .status()));
}

}  // namespace
}  // namespace mlaserve::client
