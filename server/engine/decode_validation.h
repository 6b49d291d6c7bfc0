#ifndef MLASERVE_SERVER_ENGINE_DECODE_VALIDATION_H_
#define MLASERVE_SERVER_ENGINE_DECODE_VALIDATION_H_

#include <span>

#include "absl/status/status.h"
#include "server/engine/engine_types.h"
#include "server/engine/kv/kv_store.h"

namespace mlaserve::engine {

// Every rule a Decode call must satisfy, in one place (the gRPC edge only decodes the wire's
// bytes into views; docs/api.md tabulates the errors). Fields are named as in the wire's
// DecodeRequest, e.g. "queries[3].head.q_nope: shape [1,128,64] != [1,128,128]":
//  - 1..max_batch queries, no (sequence, layer) twice;
//  - sequence_id non-empty and a live sequence (NOT_FOUND otherwise), layer in [0, layers),
//    sq in [1, max_sq];
//  - head space: head.q_nope [sq][heads][dn] and head.q_pe [sq][heads][dr], the model's
//    heads [first_head, first_head + heads); latent space: latent [sq][heads][dl + dr] with
//    1 <= heads <= kMaxLatentHeads; every element finite; every query of a call with the
//    same heads and first head;
//  - append_rows [n][dl + dr] (n >= 1, finite) exactly when append_position >= 0.
// Tensors must be row-major and contiguous. INVALID_ARGUMENT for everything but the unknown
// sequence; nothing is changed either way.
absl::Status ValidateDecodeCall(std::span<const DecodeQuery> queries, const EngineInfo& info,
                                const KvStore& store);

// The call's options: softmax_scale, when given, finite and positive. INVALID_ARGUMENT
// naming the field ("softmax_scale: -0.5 is not a positive finite number").
absl::Status ValidateDecodeOptions(const DecodeOptions& options);

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_DECODE_VALIDATION_H_
