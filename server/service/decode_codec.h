#ifndef MLASERVE_SERVER_SERVICE_DECODE_CODEC_H_
#define MLASERVE_SERVER_SERVICE_DECODE_CODEC_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mlaserve/v1/decode.pb.h"
#include "server/engine/engine.h"

namespace mlaserve::service {

// Translation between the wire's Decode messages and the engine's DecodeQuery/DecodeAnswer.
// The edge checks everything the wire carries (tensors, shapes against the served model,
// layer and sq ranges, batch size, dtypes); ids, positions and memory are the engine's.

// Shape of one query's output: [sq][heads][width], width dv (head space) or dl (latent).
struct AnswerLayout {
  int sq = 0;
  int heads = 0;
  int width = 0;
};

struct ParsedDecode {
  std::vector<engine::DecodeQuery> queries;
  std::vector<AnswerLayout> layouts;  // per query
  v1::DType output_dtype = v1::DTYPE_BF16;
};

// INVALID_ARGUMENT naming the field (`queries[3].head.q_nope: shape [1,128,64] !=
// [1,128,128]`) for anything malformed.
absl::StatusOr<ParsedDecode> ParseDecodeRequest(const v1::DecodeRequest& request,
                                                const engine::EngineInfo& info);

// Fills `response` with one result per answer. INTERNAL if the engine's answers do not have
// the layouts' sizes (an engine bug must not reach the wire as garbage).
absl::Status FillDecodeResponse(const std::vector<AnswerLayout>& layouts,
                                v1::DType output_dtype,
                                const std::vector<engine::DecodeAnswer>& answers,
                                v1::DecodeResponse* response);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_DECODE_CODEC_H_
