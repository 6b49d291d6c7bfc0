#include "server/service/kv_request_codec.h"

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mlaserve::service {

absl::StatusOr<Bf16Tensor> ParsePrefixLatent(const v1::RegisterPrefixRequest& request,
                                             const engine::ModelConfig& model) {
  const std::array<int64_t, 3> shape{model.layers, kAnyExtent, model.dk_latent()};
  if (!request.has_latent()) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent: missing; expected ", ShapeToString(shape)));
  }
  return DecodeToBf16(request.latent(), shape, "latent");
}

absl::StatusOr<Bf16Tensor> ParseAppendChunk(const v1::AppendKvChunk& chunk,
                                            const engine::ModelConfig& model,
                                            const std::string& field) {
  if (chunk.sequence_id().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".sequence_id: empty"));
  }
  if (chunk.layer() < 0 || chunk.layer() >= model.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".layer: ", chunk.layer(), " is outside [0, ", model.layers, ")"));
  }
  if (chunk.start_position() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".start_position: ", chunk.start_position(), " is negative"));
  }
  const std::array<int64_t, 2> shape{kAnyExtent, model.dk_latent()};
  if (!chunk.has_rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".rows: missing; expected ", ShapeToString(shape)));
  }
  return DecodeToBf16(chunk.rows(), shape, field + ".rows");
}

}  // namespace mlaserve::service
