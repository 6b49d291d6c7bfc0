#ifndef MLASERVE_SERVER_SERVICE_APPEND_KV_REACTOR_H_
#define MLASERVE_SERVER_SERVICE_APPEND_KV_REACTOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_callback.h"
#include "mlaserve/v1/kv_cache.pb.h"
#include "server/engine/engine.h"
#include "server/service/service_metrics.h"

namespace mlaserve::service {

// The AppendKv client stream: applies each chunk as it arrives (a KV append is a bounded
// copy, so it runs on the callback thread) and ends the call at the first failing chunk,
// naming it. Deletes itself when the call is done.
class AppendKvReactor : public grpc::ServerReadReactor<v1::AppendKvChunk> {
 public:
  AppendKvReactor(engine::Engine& engine, ServiceMetrics& metrics, v1::AppendKvResponse* response);

  void OnReadDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  absl::Status Apply(const v1::AppendKvChunk& chunk);
  void Complete(const absl::Status& status);

  engine::Engine& engine_;
  ServiceMetrics& metrics_;
  v1::AppendKvResponse* const response_;
  const absl::Time start_ = absl::Now();
  v1::AppendKvChunk chunk_;
  int64_t chunks_ = 0;
  int64_t rows_ = 0;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_APPEND_KV_REACTOR_H_
