#ifndef MLASERVE_SERVER_SERVICE_DECODE_ANSWERS_H_
#define MLASERVE_SERVER_SERVICE_DECODE_ANSWERS_H_

#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "mlaserve/v1/decode.pb.h"
#include "server/engine/engine_types.h"
#include "server/service/decode_codec.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

// A call's answers as the engine gives them (its memory, valid while the engine's callback
// runs), with what encoding them needs. Every transport writes them from here: gRPC as one
// message buffer, the data plane into the caller's registered memory.
struct AnsweredDecode {
  const ParsedDecode* call = nullptr;
  std::span<const engine::DecodeAnswer> answers;
  const engine::ModelConfig* model = nullptr;
  // Plans name prefixes in its namespace; they are written without it.
  Tenant* tenant = nullptr;

  // Output elements and bytes of query i in the call's output dtype.
  int64_t OutElements(size_t i) const;
  uint64_t OutBytes(size_t i) const;
};

// INTERNAL naming the query if an answer's size does not fit it (an engine bug must not reach
// the wire as garbage).
absl::Status CheckAnswers(const AnsweredDecode& answered);

// The wire form of a query's plan.
v1::DecodePlan WirePlan(const engine::PlanInfo& plan, Tenant* tenant);

// A packed call's outputs [B][sq][heads][width] in its output dtype to `out`, and its LSEs
// [B][sq][heads] (fp32) to `lse`; CheckAnswers first.
void EncodePackedOutputs(const AnsweredDecode& answered, void* out, void* lse);

// The bytes of a DecodeResponse answering the call in its own form (results, or packed), or,
// with `stream_request_id`, of a DecodeStreamResponse carrying that id, an OK status and the
// response. Each output is encoded once, from the engine's memory into the message. The
// CheckAnswers status if the answers do not fit the call.
absl::StatusOr<grpc::ByteBuffer> WriteDecodeResponse(
    const AnsweredDecode& answered, std::optional<uint64_t> stream_request_id = std::nullopt);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_DECODE_ANSWERS_H_
