#ifndef MLASERVE_CLIENT_CLUSTER_CONTEXT_PARALLEL_H_
#define MLASERVE_CLIENT_CLUSTER_CONTEXT_PARALLEL_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mlaserve/v1/mlaserve.grpc.pb.h"

// Context-parallel decode (docs/cluster.md): a sequence split by position over several
// servers, each part a sequence of its own, a query answered by every part and the answers
// merged by their log-sum-exps. Exact up to fp32 rounding: softmax over the union of the
// parts' keys is the LSE-weighted mean of the parts' softmaxes.
namespace mlaserve::client {

// The positions [start, end) of the whole sequence one part holds, and its id on its server.
struct SequencePart {
  std::string sequence_id;
  int64_t start = 0;
  int64_t end = 0;
};

// A query sent to one part: its tokens are the original query's [first_token, first_token +
// query.sq()).
struct PartQuery {
  size_t part = 0;
  int first_token = 0;
  v1::DecodeQuery query;
};

// Splits `query` (no append: apply it first) over `parts`, which tile [0, length) in order;
// `length` is the layer's length, the query's sq tokens being its last positions t_s = length
// - sq + s. For each part [a, b): the tokens inside it form one query of those tokens (the
// server's bottom-right causal mask is then what the whole sequence's would be), and each
// token past b is a query of its own with sq = 1 (it sees the whole part); a token before a
// sees no key of the part and is not sent there.
// INVALID_ARGUMENT for a query carrying an append, or parts that do not tile [0, length).
absl::StatusOr<std::vector<PartQuery>> SplitOverParts(const v1::DecodeQuery& query, int64_t length,
                                                      std::span<const SequencePart> parts);

// One query's answer from its parts' fp32 answers (`answers[i]` answers `part_queries[i]`):
// per (token, head) out = sum_p w_p out_p / sum_p w_p with w_p = exp(lse_p - max lse), lse =
// max + log(sum w_p), in double; a row no part saw has out 0 and lse -inf. `out` in
// `output_dtype` (rounded to nearest even), the plan the first part's. INVALID_ARGUMENT when
// an answer is not fp32 or its shape does not match its query.
absl::StatusOr<v1::DecodeResult> MergeByLse(int sq, std::span<const PartQuery> part_queries,
                                            std::span<const v1::DecodeResult> answers,
                                            v1::DType output_dtype);

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_CLUSTER_CONTEXT_PARALLEL_H_
