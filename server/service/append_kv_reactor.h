#ifndef MLASERVE_SERVER_SERVICE_APPEND_KV_REACTOR_H_
#define MLASERVE_SERVER_SERVICE_APPEND_KV_REACTOR_H_

#include <cstdint>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "mlaserve/v1/kv_cache.pb.h"
#include "server/engine/engine.h"
#include "server/service/call_registry.h"
#include "server/service/moved_sequences.h"
#include "server/service/service_metrics.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

// The AppendKv client stream: applies each chunk as it arrives (a KV append is a bounded
// copy, so it runs on the callback thread) and ends the call at the first failing chunk,
// naming it (`chunks[i]`, also for a message that does not parse). Deletes itself when the
// call is done.
//
// When the server drains, the stream ends at once between chunks with UNAVAILABLE saying
// how many chunks were applied; an idle stream does not hold the shutdown.
class AppendKvReactor : public grpc::ServerReadReactor<grpc::ByteBuffer>, public DrainableStream {
 public:
  // `admitted`: the caller's tenant (nullptr: single-tenant), or why the stream is refused
  // (it then ends at once with that status). `client` is whose open streams it counts
  // against (CallRegistry::Add).
  AppendKvReactor(absl::StatusOr<Tenant*> admitted, const std::string& client,
                  engine::Engine& engine, const MovedSequences& moved, ServiceMetrics& metrics,
                  CallRegistry& registry, grpc::ByteBuffer* response);

  void OnReadDone(bool ok) override;
  void OnDone() override;
  void Drain() override;

 private:
  absl::Status Apply(v1::AppendKvChunk& chunk);
  // Finishes the call with `status` (once: finished_ is set).
  void CompleteLocked(const absl::Status& status);

  Tenant* const tenant_;
  engine::Engine& engine_;
  const MovedSequences& moved_;
  ServiceMetrics& metrics_;
  CallRegistry& registry_;
  grpc::ByteBuffer* const response_;
  // Before registered_: a drain may reach the stream as soon as it is registered.
  std::mutex mu_;
  bool finished_ = false;
  const absl::Status registration_;
  const bool registered_;
  const absl::Time start_ = absl::Now();
  grpc::ByteBuffer chunk_bytes_;
  v1::AppendKvChunk chunk_;
  int64_t chunks_ = 0;
  int64_t rows_ = 0;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_APPEND_KV_REACTOR_H_
