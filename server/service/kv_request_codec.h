#ifndef MLASERVE_SERVER_SERVICE_KV_REQUEST_CODEC_H_
#define MLASERVE_SERVER_SERVICE_KV_REQUEST_CODEC_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/kv_dtype.h"
#include "mlaserve/v1/kv_cache.pb.h"
#include "server/engine/model/model_config.h"
#include "server/service/tensor_codec.h"

namespace mlaserve::service {

// The KV rows of RegisterPrefix and AppendKv, checked against the served model. Ids,
// positions and the memory budget are the engine's to judge.

// RegisterPrefixRequest.latent: [layers][tokens][dl + dr] with every layer of the model.
absl::StatusOr<Bf16Tensor> ParsePrefixLatent(const v1::RegisterPrefixRequest& request,
                                             const engine::ModelConfig& model);

// One AppendKvChunk's rows [n][dl + dr] and its layer; `field` names the chunk in errors
// ("chunks[3]").
absl::StatusOr<Bf16Tensor> ParseAppendChunk(const v1::AppendKvChunk& chunk,
                                            const engine::ModelConfig& model,
                                            const std::string& field);

// The same chunk carrying fp8_rows: its id, layer and position, and count * (dl + 4 + 2 dr)
// bytes exactly. What the bytes hold (scales, codes) the store checks, naming the row.
absl::Status CheckFp8AppendChunk(const v1::AppendKvChunk& chunk, const engine::ModelConfig& model,
                                 const std::string& field);

// A request's kv_dtype: nullopt when unset; INVALID_ARGUMENT naming `field` for a value this
// server does not know.
absl::StatusOr<std::optional<KvDtype>> ParseKvDtype(v1::KvDtype wire, absl::string_view field);
v1::KvDtype ToWire(KvDtype dtype);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_KV_REQUEST_CODEC_H_
