#ifndef MLASERVE_SERVER_SERVICE_DECODE_CODEC_H_
#define MLASERVE_SERVER_SERVICE_DECODE_CODEC_H_

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mlaserve/v1/decode.pb.h"
#include "server/engine/engine.h"

namespace mlaserve::service {

// Translation between the wire's Decode messages and the engine's DecodeQuery/DecodeAnswer.
// The edge decodes the wire format only (the oneof, dtypes, byte lengths against declared
// shapes); every rule about what a query may ask (layers, sq, shapes against the model,
// finiteness, appends, batch size) is the engine's (engine/decode_validation.h), so it is
// checked once, for gRPC and in-process callers alike.

struct ParsedDecode {
  // Views of the request's bytes (bf16 tensors) or of `converted` (fp16/fp32 ones): valid
  // while both the request and this object live.
  std::vector<engine::DecodeQuery> queries;
  std::vector<std::vector<Bf16>> converted;
  v1::DType output_dtype = v1::DTYPE_BF16;
  std::optional<float> softmax_scale;  // the engine checks it (ValidateDecodeOptions)
};

// INVALID_ARGUMENT naming the field (`queries[3].head.q_nope: 4607 bytes != 2304 elements`)
// for anything the wire cannot carry.
absl::StatusOr<std::unique_ptr<ParsedDecode>> ParseDecodeRequest(const v1::DecodeRequest& request);

// Fills `response` with one result per answer, encoded as `output_dtype` straight from the
// engine's buffers. INTERNAL if an answer's size does not fit its query (an engine bug must
// not reach the wire as garbage).
absl::Status FillDecodeResponse(std::span<const engine::DecodeQuery> queries,
                                const engine::ModelConfig& model, v1::DType output_dtype,
                                std::span<const engine::DecodeAnswer> answers,
                                v1::DecodeResponse* response);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_DECODE_CODEC_H_
