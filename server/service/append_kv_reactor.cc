#include "server/service/append_kv_reactor.h"

#include <array>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/tensor_view.h"
#include "server/service/kv_request_codec.h"
#include "server/service/status_mapping.h"

namespace mlaserve::service {

AppendKvReactor::AppendKvReactor(engine::Engine& engine, ServiceMetrics& metrics,
                                 v1::AppendKvResponse* response)
    : engine_(engine), metrics_(metrics), response_(response) {
  StartRead(&chunk_);
}

void AppendKvReactor::OnReadDone(bool ok) {
  // Not ok: the client half-closed after its last chunk (or went away, and then nobody
  // reads the status).
  if (!ok) {
    Complete(absl::OkStatus());
    return;
  }
  if (absl::Status status = Apply(chunk_); !status.ok()) {
    Complete(status);
    return;
  }
  StartRead(&chunk_);
}

absl::Status AppendKvReactor::Apply(const v1::AppendKvChunk& chunk) {
  const std::string field = absl::StrCat("chunks[", chunks_, "]");
  if (chunk.has_fp8_rows()) {
    RETURN_IF_ERROR(CheckFp8AppendChunk(chunk, engine_.Info().model, field));
    const std::string& data = chunk.fp8_rows().data();
    if (absl::Status status =
            engine_.AppendKvFp8(chunk.sequence_id(), chunk.layer(), chunk.start_position(),
                                std::as_bytes(std::span<const char>(data.data(), data.size())),
                                chunk.fp8_rows().count());
        !status.ok()) {
      return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
    }
    ++chunks_;
    rows_ += chunk.fp8_rows().count();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(Bf16Tensor rows, ParseAppendChunk(chunk, engine_.Info().model, field));
  using RowsView = TensorView<const Bf16, 2>;
  const RowsView::Index shape{rows.shape[0], rows.shape[1]};
  ASSIGN_OR_RETURN(RowsView view, RowsView::Create(rows.values, shape, field));
  if (absl::Status status =
          engine_.AppendKv(chunk.sequence_id(), chunk.layer(), chunk.start_position(), view);
      !status.ok()) {
    return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
  }
  ++chunks_;
  rows_ += rows.shape[0];
  return absl::OkStatus();
}

void AppendKvReactor::Complete(const absl::Status& status) {
  response_->set_chunks(chunks_);
  response_->set_rows(rows_);
  metrics_.RecordRpc("AppendKv", status.code(), absl::Now() - start_);
  Finish(ToGrpcStatus(status));
}

}  // namespace mlaserve::service
