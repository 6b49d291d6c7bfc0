#include "server/service/append_kv_reactor.h"

#include <array>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/tensor_view.h"
#include "server/service/kv_requests.h"
#include "server/service/status_mapping.h"
#include "server/service/tenant_scope.h"
#include "server/service/wire_message.h"

namespace mlaserve::service {

namespace {

absl::Status Draining(int64_t chunks) {
  return absl::UnavailableError(
      absl::StrCat("the server is shutting down after applying ", chunks,
                   " chunk(s); send the rest to another replica (appends are idempotent by "
                   "position)"));
}

}  // namespace

AppendKvReactor::AppendKvReactor(absl::StatusOr<Tenant*> admitted, const std::string& client,
                                 engine::Engine& engine, const MovedSequences& moved,
                                 ServiceMetrics& metrics, CallRegistry& registry,
                                 grpc::ByteBuffer* response)
    : tenant_(admitted.ok() ? *admitted : nullptr),
      engine_(engine),
      moved_(moved),
      metrics_(metrics),
      registry_(registry),
      response_(response),
      registration_(registry.Add(this, client)),
      registered_(registration_.ok()) {
  std::lock_guard lock(mu_);
  if (!admitted.ok()) {
    CompleteLocked(admitted.status());
  } else if (absl::IsUnavailable(registration_)) {
    CompleteLocked(Draining(0));
  } else if (!registered_) {
    CompleteLocked(registration_);
  }
  if (!finished_) StartRead(&chunk_bytes_);
}

void AppendKvReactor::OnReadDone(bool ok) {
  // Chunks are applied under the stream's lock, so a drain waits for the one being applied.
  std::lock_guard lock(mu_);
  if (finished_) return;  // drained while the read was pending
  // Not ok: the client half-closed after its last chunk (or went away, and then nobody
  // reads the status).
  if (!ok) {
    CompleteLocked(absl::OkStatus());
    return;
  }
  absl::Status status =
      ParseWireMessage(chunk_bytes_, absl::StrCat("chunks[", chunks_, "]"), &chunk_);
  chunk_bytes_.Clear();
  if (status.ok()) status = Apply(chunk_);
  if (!status.ok()) {
    CompleteLocked(status);
    return;
  }
  StartRead(&chunk_bytes_);
}

void AppendKvReactor::Drain() {
  std::lock_guard lock(mu_);
  if (!finished_) CompleteLocked(Draining(chunks_));
}

void AppendKvReactor::OnDone() {
  if (registered_) registry_.Remove(this);
  delete this;
}

absl::Status AppendKvReactor::Apply(v1::AppendKvChunk& chunk) {
  const std::string field = absl::StrCat("chunks[", chunks_, "]");
  RETURN_IF_ERROR(ScopeIds(tenant_, chunk, field));
  RETURN_IF_ERROR(moved_.Check(chunk.sequence_id(), field + ".sequence_id"));
  absl::StatusOr<int64_t> applied = ApplyAppendChunk(engine_, chunk, field);
  if (!applied.ok()) return UnscopeStatus(tenant_, applied.status());
  const int64_t rows = *applied;
  ++chunks_;
  rows_ += rows;
  return absl::OkStatus();
}

void AppendKvReactor::CompleteLocked(const absl::Status& status) {
  finished_ = true;
  v1::AppendKvResponse response;
  response.set_chunks(chunks_);
  response.set_rows(rows_);
  SerializeWireMessage(response, response_);
  metrics_.RecordRpc("AppendKv", status.code(), absl::Now() - start_);
  Finish(ToGrpcStatus(status));
}

}  // namespace mlaserve::service
