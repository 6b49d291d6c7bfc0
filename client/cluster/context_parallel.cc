#include "client/cluster/context_parallel.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "client/tensor_helpers.h"

namespace mlaserve::client {
namespace {

v1::DecodeQuery TokensOf(const v1::DecodeQuery& query, const std::string& part_id, int first,
                         int count) {
  v1::DecodeQuery sub;
  sub.set_sequence_id(part_id);
  sub.set_layer(query.layer());
  sub.set_sq(count);
  if (query.has_head()) {
    v1::HeadSpaceQuery& head = *sub.mutable_head();
    *head.mutable_q_nope() = SliceOuter(query.head().q_nope(), first, count);
    *head.mutable_q_pe() = SliceOuter(query.head().q_pe(), first, count);
    head.set_first_head(query.head().first_head());
  } else {
    *sub.mutable_latent() = SliceOuter(query.latent(), first, count);
  }
  return sub;
}

}  // namespace

absl::StatusOr<std::vector<PartQuery>> SplitOverParts(const v1::DecodeQuery& query, int64_t length,
                                                      std::span<const SequencePart> parts) {
  if (query.has_append_rows() || query.has_append_position()) {
    return absl::InvalidArgumentError(
        "queries.append_rows: a context-parallel query's append is applied before it is split");
  }
  int64_t expected_start = 0;
  for (const SequencePart& part : parts) {
    if (part.start != expected_start || part.end < part.start) {
      return absl::InvalidArgumentError(absl::StrCat("parts do not tile the sequence: part '",
                                                     part.sequence_id, "' starts at ", part.start,
                                                     ", expected ", expected_start));
    }
    expected_start = part.end;
  }
  if (expected_start != length) {
    return absl::InvalidArgumentError(
        absl::StrCat("parts end at ", expected_start, " but the layer holds ", length));
  }
  const int sq = query.sq();
  if (sq < 1 || sq > length) {
    return absl::InvalidArgumentError(
        absl::StrCat("queries.sq: ", sq, " tokens on a layer of ", length));
  }
  std::vector<PartQuery> out;
  for (size_t p = 0; p < parts.size(); ++p) {
    const SequencePart& part = parts[p];
    if (part.end == part.start) continue;
    // Token s is at position length - sq + s.
    const auto token_at = [&](int64_t position) {
      return static_cast<int>(position - (length - sq));
    };
    const int first_inside = std::max(0, token_at(part.start));
    const int past = std::max(0, token_at(part.end));  // first token past the part
    if (first_inside < std::min(past, sq)) {
      out.push_back(
          {p, first_inside,
           TokensOf(query, part.sequence_id, first_inside, std::min(past, sq) - first_inside)});
    }
    for (int s = past; s < sq; ++s) out.push_back({p, s, TokensOf(query, part.sequence_id, s, 1)});
  }
  return out;
}

absl::StatusOr<v1::DecodeResult> MergeByLse(int sq, std::span<const PartQuery> part_queries,
                                            std::span<const v1::DecodeResult> answers,
                                            v1::DType output_dtype) {
  if (part_queries.size() != answers.size() || answers.empty()) {
    return absl::InvalidArgumentError("MergeByLse: one answer per part query, at least one");
  }
  const v1::Tensor& first_out = answers[0].out();
  if (first_out.shape_size() != 3) {
    return absl::InvalidArgumentError("results.out: a part's answer is not [sq][heads][width]");
  }
  const int64_t heads = first_out.shape(1);
  const int64_t width = first_out.shape(2);
  const int64_t rows = sq * heads;
  std::vector<double> max_lse(rows, -std::numeric_limits<double>::infinity());
  std::vector<std::vector<float>> outs(answers.size()), lses(answers.size());
  for (size_t i = 0; i < answers.size(); ++i) {
    const v1::DecodeResult& answer = answers[i];
    const int tokens = part_queries[i].query.sq();
    if (answer.out().dtype() != v1::DTYPE_FP32 || answer.out().shape_size() != 3 ||
        answer.out().shape(0) != tokens || answer.out().shape(1) != heads ||
        answer.out().shape(2) != width) {
      return absl::InvalidArgumentError(absl::StrCat(
          "results.out: part '", part_queries[i].query.sequence_id(),
          "' answered a tensor that is not fp32 [", tokens, "][", heads, "][", width, "]"));
    }
    absl::StatusOr<std::vector<float>> out = TensorToFloats(answer.out());
    absl::StatusOr<std::vector<float>> lse = TensorToFloats(answer.lse());
    if (!out.ok()) return out.status();
    if (!lse.ok()) return lse.status();
    if (static_cast<int64_t>(lse->size()) != tokens * heads) {
      return absl::InvalidArgumentError("results.lse: not [sq][heads]");
    }
    for (int t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = (part_queries[i].first_token + t) * heads + h;
        max_lse[row] = std::max(max_lse[row], static_cast<double>((*lse)[t * heads + h]));
      }
    }
    outs[i] = *std::move(out);
    lses[i] = *std::move(lse);
  }
  std::vector<double> sum_out(rows * width, 0.0), sum_weight(rows, 0.0);
  for (size_t i = 0; i < answers.size(); ++i) {
    const int tokens = part_queries[i].query.sq();
    for (int t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = (part_queries[i].first_token + t) * heads + h;
        const double lse = lses[i][t * heads + h];
        if (std::isinf(max_lse[row]) || std::isinf(lse)) continue;
        const double weight = std::exp(lse - max_lse[row]);
        sum_weight[row] += weight;
        const float* part_out = &outs[i][(t * heads + h) * width];
        double* total = &sum_out[row * width];
        for (int64_t w = 0; w < width; ++w) total[w] += weight * part_out[w];
      }
    }
  }
  std::vector<float> out(rows * width, 0.0f), lse(rows);
  for (int64_t row = 0; row < rows; ++row) {
    if (sum_weight[row] == 0.0) {
      lse[row] = -std::numeric_limits<float>::infinity();
      continue;
    }
    lse[row] = static_cast<float>(max_lse[row] + std::log(sum_weight[row]));
    for (int64_t w = 0; w < width; ++w) {
      out[row * width + w] = static_cast<float>(sum_out[row * width + w] / sum_weight[row]);
    }
  }
  v1::DecodeResult merged;
  const int64_t out_shape[] = {sq, heads, width};
  const int64_t lse_shape[] = {sq, heads};
  *merged.mutable_out() = FloatTensor(
      out, out_shape, output_dtype == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_BF16 : output_dtype);
  *merged.mutable_lse() = Fp32Tensor(lse, lse_shape);
  *merged.mutable_plan() = answers[0].plan();
  return merged;
}

}  // namespace mlaserve::client
