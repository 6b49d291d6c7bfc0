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

namespace {

absl::Status CheckChunkHeader(const v1::AppendKvChunk& chunk, const engine::ModelConfig& model,
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
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Bf16Tensor> ParseAppendChunk(const v1::AppendKvChunk& chunk,
                                            const engine::ModelConfig& model,
                                            const std::string& field) {
  if (absl::Status s = CheckChunkHeader(chunk, model, field); !s.ok()) return s;
  const std::array<int64_t, 2> shape{kAnyExtent, model.dk_latent()};
  if (!chunk.has_rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".rows: missing; expected ", ShapeToString(shape)));
  }
  return DecodeToBf16(chunk.rows(), shape, field + ".rows");
}

absl::Status CheckFp8AppendChunk(const v1::AppendKvChunk& chunk, const engine::ModelConfig& model,
                                 const std::string& field) {
  if (absl::Status s = CheckChunkHeader(chunk, model, field); !s.ok()) return s;
  const v1::Fp8Rows& rows = chunk.fp8_rows();
  const int64_t row_bytes = Fp8PageLayout::BytesPerToken(model.dl, model.dr);
  if (rows.count() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".fp8_rows.count: ", rows.count(), "; at least one row"));
  }
  if (rows.count() > static_cast<int64_t>(rows.data().size()) / row_bytes ||
      static_cast<int64_t>(rows.data().size()) != rows.count() * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".fp8_rows.data: ", rows.data().size(), " bytes; ", rows.count(), " rows of ",
        row_bytes, " bytes (dl e4m3, fp32 scale, dr bf16) need ", rows.count() * row_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<KvDtype>> ParseKvDtype(v1::KvDtype wire, absl::string_view field) {
  switch (wire) {
    case v1::KV_DTYPE_UNSPECIFIED:
      return std::nullopt;
    case v1::KV_DTYPE_BF16:
      return KvDtype::kBf16;
    case v1::KV_DTYPE_FP8:
      return KvDtype::kFp8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", static_cast<int>(wire),
                       " is not a KV format (KV_DTYPE_BF16, KV_DTYPE_FP8)"));
  }
}

v1::KvDtype ToWire(KvDtype dtype) {
  return dtype == KvDtype::kFp8 ? v1::KV_DTYPE_FP8 : v1::KV_DTYPE_BF16;
}

}  // namespace mlaserve::service
