#include "server/service/kv_requests.h"

#include <optional>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/tensor_view.h"
#include "server/service/kv_request_codec.h"

namespace mlaserve::service {

absl::Status RegisterPrefixOnEngine(engine::Engine& engine,
                                    const v1::RegisterPrefixRequest& request) {
  ASSIGN_OR_RETURN(Bf16Tensor latent, ParsePrefixLatent(request, engine.Info().model));
  using LatentView = TensorView<const Bf16, 3>;
  const LatentView::Index shape{latent.shape[0], latent.shape[1], latent.shape[2]};
  ASSIGN_OR_RETURN(LatentView view, LatentView::Create(latent.values, shape, "latent"));
  ASSIGN_OR_RETURN(const std::optional<KvDtype> kv_dtype,
                   ParseKvDtype(request.kv_dtype(), "kv_dtype"));
  return engine.RegisterPrefix(request.prefix_id(), request.parent_id(), view, kv_dtype);
}

absl::StatusOr<int64_t> ApplyAppendChunk(engine::Engine& engine, const v1::AppendKvChunk& chunk,
                                         absl::string_view field) {
  auto prefixed = [field](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
  };
  if (chunk.has_fp8_rows()) {
    RETURN_IF_ERROR(CheckFp8AppendChunk(chunk, engine.Info().model, std::string(field)));
    const std::string& data = chunk.fp8_rows().data();
    if (absl::Status status =
            engine.AppendKvFp8(chunk.sequence_id(), chunk.layer(), chunk.start_position(),
                               std::as_bytes(std::span<const char>(data.data(), data.size())),
                               chunk.fp8_rows().count());
        !status.ok()) {
      return prefixed(status);
    }
    return chunk.fp8_rows().count();
  }
  ASSIGN_OR_RETURN(Bf16Tensor rows,
                   ParseAppendChunk(chunk, engine.Info().model, std::string(field)));
  using RowsView = TensorView<const Bf16, 2>;
  const RowsView::Index shape{rows.shape[0], rows.shape[1]};
  ASSIGN_OR_RETURN(RowsView view, RowsView::Create(rows.values, shape, field));
  if (absl::Status status =
          engine.AppendKv(chunk.sequence_id(), chunk.layer(), chunk.start_position(), view);
      !status.ok()) {
    return prefixed(status);
  }
  return rows.shape[0];
}

}  // namespace mlaserve::service
