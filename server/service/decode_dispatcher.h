#ifndef MLASERVE_SERVER_SERVICE_DECODE_DISPATCHER_H_
#define MLASERVE_SERVER_SERVICE_DECODE_DISPATCHER_H_

#include <functional>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "mlaserve/v1/decode.pb.h"
#include "server/engine/engine.h"
#include "server/service/moved_sequences.h"
#include "server/service/service_metrics.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

// Runs one wire DecodeRequest through the engine, for both the unary Decode and each
// request of a DecodeStream: parse and check it, submit it with the caller's deadline and
// cancellation, turn the answers into the response, and record the plans in the metrics.
//
// Engine statuses pass through unchanged: a full queue is already UNAVAILABLE (transient)
// and a full KV cache RESOURCE_EXHAUSTED; docs/api.md has the table.
class DecodeDispatcher {
 public:
  using Done = absl::AnyInvocable<void(absl::Status) &&>;

  DecodeDispatcher(engine::Engine& engine, const MovedSequences& moved, ServiceMetrics& metrics)
      : engine_(engine), moved_(moved), metrics_(metrics) {}

  // `request` (its ids moved into `tenant`'s namespace here) and `response` must stay valid
  // until `done` runs. `done` runs exactly once, possibly before Dispatch returns, possibly
  // on an engine thread. A tenant's queries count against its share of the queue while
  // they are queued or running: past it, UNAVAILABLE at once.
  void Dispatch(v1::DecodeRequest& request, Tenant* tenant, absl::Time deadline,
                std::function<bool()> cancelled, v1::DecodeResponse* response, Done done);

 private:
  engine::Engine& engine_;
  const MovedSequences& moved_;
  ServiceMetrics& metrics_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_DECODE_DISPATCHER_H_
