#include "server/service/decode_stream_reactor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/service/call_deadline.h"
#include "server/service/decode_answers.h"
#include "server/service/decode_codec.h"
#include "server/service/status_mapping.h"
#include "server/service/wire_message.h"

namespace mlaserve::service {
namespace {

constexpr char kStreamDrainingMessage[] =
    "the server is shutting down; reconnect to another replica";

void SetStatus(const absl::Status& status, v1::RequestStatus* wire) {
  wire->set_code(static_cast<int>(status.code()));
  wire->set_message(std::string(status.message()));
}

}  // namespace

DecodeStreamReactor::DecodeStreamReactor(grpc::CallbackServerContext* context,
                                         absl::StatusOr<Tenant*> admitted,
                                         const std::string& client, DecodeDispatcher& dispatcher,
                                         ServiceMetrics& metrics, CallRegistry& registry,
                                         int max_in_flight)
    : context_(context),
      tenant_(admitted.ok() ? *admitted : nullptr),
      dispatcher_(dispatcher),
      metrics_(metrics),
      registry_(registry),
      max_in_flight_(std::max(1, max_in_flight)),
      registration_(registry.Add(this, client)),
      registered_(registration_.ok()) {
  std::lock_guard lock(mu_);
  if (absl::IsUnavailable(registration_)) draining_ = true;
  if (!admitted.ok() || (!registered_ && !draining_)) {
    ended_ = admitted.ok() ? registration_ : admitted.status();
    reads_done_ = true;
  }
  if (draining_ || !ended_.ok()) {
    MaybeFinishLocked();
    return;
  }
  StartReadLocked();
}

void DecodeStreamReactor::StartReadLocked() {
  reading_ = true;
  StartRead(&request_bytes_);
}

void DecodeStreamReactor::MaybeReadLocked() {
  // An answer waiting for the client to read it holds its slot as a request in the engine
  // does: a client that never reads stops being read, instead of growing the write queue.
  const size_t held = static_cast<size_t>(in_flight_) + writes_.size();
  if (reading_ || reads_done_ || draining_ || finished_ ||
      held >= static_cast<size_t>(max_in_flight_))
    return;
  StartReadLocked();
}

void DecodeStreamReactor::OnReadDone(bool ok) {
  // Its own object: the engine reads the request's bytes in place until it answers, while
  // the read buffer takes the next message.
  auto request = std::make_unique<v1::DecodeStreamRequest>();
  {
    std::lock_guard lock(mu_);
    reading_ = false;
    if (!ok) {
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    if (finished_) return;
    const absl::Status parsed = ParseWireMessage(
        request_bytes_, absl::StrCat("requests[", requests_read_, "]"), request.get());
    request_bytes_.Clear();
    ++requests_read_;
    if (!parsed.ok()) {
      // Its request id is unknown, so it cannot be answered in-band: the stream ends.
      ended_ = parsed;
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    ++in_flight_;
    MaybeReadLocked();
  }
  // Outside the lock: the engine may answer before Dispatch returns.
  Dispatch(std::move(request));
}

void DecodeStreamReactor::Dispatch(std::unique_ptr<v1::DecodeStreamRequest> request) {
  const absl::Time arrival = absl::Now();
  auto response = std::make_unique<Response>();
  response->set_request_id(request->request_id());
  bool draining;
  {
    std::lock_guard lock(mu_);
    draining = draining_;
  }
  if (draining) {
    SetStatus(absl::UnavailableError(kStreamDrainingMessage), response->mutable_status());
    metrics_.RecordRpc("DecodeStream.request", absl::StatusCode::kUnavailable,
                       absl::Now() - arrival);
    Answer(*response);
    return;
  }
  absl::Time deadline = CallDeadline(*context_);
  if (request->timeout_us() > 0) {
    deadline =
        std::min(deadline, arrival + absl::Microseconds(static_cast<int64_t>(
                                         std::min<uint64_t>(request->timeout_us(), INT64_MAX))));
  }
  absl::StatusOr<std::unique_ptr<ParsedDecode>> call = ParseDecodeRequest(request->request());
  if (!call.ok()) {
    SetStatus(call.status(), response->mutable_status());
    metrics_.RecordRpc("DecodeStream.request", call.status().code(), absl::Now() - arrival);
    Answer(*response);
    return;
  }
  (*call)->keep_alive = std::shared_ptr<v1::DecodeStreamRequest>(std::move(request));
  dispatcher_.Dispatch(
      *std::move(call), tenant_, deadline, [context = context_] { return context->IsCancelled(); },
      [this, arrival,
       response = std::move(response)](absl::StatusOr<AnsweredDecode> answered) mutable {
        absl::Status status = answered.status();
        if (answered.ok()) {
          absl::StatusOr<grpc::ByteBuffer> bytes =
              WriteDecodeResponse(*answered, response->request_id());
          status = bytes.status();
          if (bytes.ok()) {
            metrics_.RecordRpc("DecodeStream.request", status.code(), absl::Now() - arrival);
            Queue(std::make_unique<grpc::ByteBuffer>(*std::move(bytes)));
            return;
          }
        }
        SetStatus(status, response->mutable_status());
        metrics_.RecordRpc("DecodeStream.request", status.code(), absl::Now() - arrival);
        Answer(*response);
      });
}

void DecodeStreamReactor::Answer(const Response& response) {
  auto bytes = std::make_unique<grpc::ByteBuffer>();
  SerializeWireMessage(response, bytes.get());  // outside the lock
  Queue(std::move(bytes));
}

void DecodeStreamReactor::Queue(std::unique_ptr<grpc::ByteBuffer> bytes) {
  std::lock_guard lock(mu_);
  --in_flight_;
  if (!write_failed_) {
    writes_.push_back(std::move(bytes));
    if (!writing_) StartWriteLocked();
  }
  MaybeReadLocked();
  MaybeFinishLocked();
}

void DecodeStreamReactor::StartWriteLocked() {
  writing_ = true;
  StartWrite(writes_.front().get());
}

void DecodeStreamReactor::OnWriteDone(bool ok) {
  std::lock_guard lock(mu_);
  writing_ = false;
  writes_.pop_front();
  if (!ok) {
    write_failed_ = true;
    writes_.clear();
  } else if (!writes_.empty()) {
    StartWriteLocked();
  }
  MaybeReadLocked();
  MaybeFinishLocked();
}

void DecodeStreamReactor::Drain() {
  std::lock_guard lock(mu_);
  draining_ = true;
  MaybeFinishLocked();
}

void DecodeStreamReactor::MaybeFinishLocked() {
  if (finished_ || in_flight_ > 0 || writing_) return;
  if (!reads_done_ && !draining_ && !write_failed_) return;
  finished_ = true;
  // A read still pending completes (not ok) after Finish.
  if (!ended_.ok()) {
    Finish(ToGrpcStatus(ended_));
  } else {
    Finish(ToGrpcStatus(draining_ && !reads_done_ ? absl::UnavailableError(kStreamDrainingMessage)
                                                  : absl::OkStatus()));
  }
}

void DecodeStreamReactor::OnDone() {
  if (registered_) registry_.Remove(this);
  delete this;
}

}  // namespace mlaserve::service
