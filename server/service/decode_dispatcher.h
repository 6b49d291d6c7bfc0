#ifndef MLASERVE_SERVER_SERVICE_DECODE_DISPATCHER_H_
#define MLASERVE_SERVER_SERVICE_DECODE_DISPATCHER_H_

#include <functional>
#include <memory>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/service/decode_answers.h"
#include "server/service/decode_codec.h"
#include "server/service/moved_sequences.h"
#include "server/service/service_metrics.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

// Runs one parsed decode call through the engine, for every transport (a unary Decode, each
// request of a DecodeStream, a data-plane call): scope its ids to the caller's tenant, refuse
// sequences that moved away, hold the tenant's queue share, submit it with the caller's
// deadline and cancellation, record the plans in the metrics, and hand the answers to the
// transport that encodes them.
//
// Engine statuses pass through unchanged but for naming: a full queue is already UNAVAILABLE
// (transient) and a full KV cache RESOURCE_EXHAUSTED; docs/api.md has the table.
class DecodeDispatcher {
 public:
  // The answers (valid only while it runs), or one status for the call, already free of the
  // tenant's namespace and, for a packed call, naming the packed form's fields.
  using Answered = absl::AnyInvocable<void(absl::StatusOr<AnsweredDecode>) &&>;

  DecodeDispatcher(engine::Engine& engine, const MovedSequences& moved, ServiceMetrics& metrics)
      : engine_(engine), moved_(moved), metrics_(metrics) {}

  // `answered` runs exactly once, possibly before Dispatch returns, possibly on an engine
  // thread; the call lives until it has returned. A tenant's queries count against its share
  // of the queue while they are queued or running: past it, UNAVAILABLE at once.
  void Dispatch(std::unique_ptr<ParsedDecode> call, Tenant* tenant, absl::Time deadline,
                std::function<bool()> cancelled, Answered answered);

 private:
  engine::Engine& engine_;
  const MovedSequences& moved_;
  ServiceMetrics& metrics_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_DECODE_DISPATCHER_H_
