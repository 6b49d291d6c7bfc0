#ifndef MLASERVE_SERVER_SERVICE_DECODE_STREAM_REACTOR_H_
#define MLASERVE_SERVER_SERVICE_DECODE_STREAM_REACTOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "mlaserve/v1/decode.pb.h"
#include "server/service/call_registry.h"
#include "server/service/decode_dispatcher.h"
#include "server/service/service_metrics.h"
#include "server/service/tenancy.h"

namespace mlaserve::service {

// One DecodeStream: every request read is dispatched at once (a worker pipelines its
// layers), answers are written in completion order with their request ids, and a failed
// request is answered in-band while the stream stays open.
//
// Flow control: at most `max_in_flight` requests of a stream are in the engine or answered
// and waiting to be sent; past that the reactor stops reading, so a client that outpaces the
// server, or never reads its answers, is held back by HTTP/2 flow control instead of growing
// the engine's queue or the server's memory.
//
// Ending: after the client half-closes, once every answer is written (OK); after a message
// that does not parse, once the requests before it are answered (INVALID_ARGUMENT naming it
// `requests[i]`); when the server
// drains, once the requests already taken are answered (UNAVAILABLE, so the worker
// reconnects elsewhere); if the client goes away, once the engine has returned every
// request (they are cancelled through the call's context). The reactor deletes itself when
// the call is done.
class DecodeStreamReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                            public DrainableStream {
 public:
  // `admitted`: the caller's tenant (nullptr: single-tenant), or why the stream is refused
  // (it then ends at once with that status). `client` is whose open streams it counts
  // against (CallRegistry::Add).
  DecodeStreamReactor(grpc::CallbackServerContext* context, absl::StatusOr<Tenant*> admitted,
                      const std::string& client, DecodeDispatcher& dispatcher,
                      ServiceMetrics& metrics, CallRegistry& registry, int max_in_flight);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;
  void Drain() override;

 private:
  using Response = v1::DecodeStreamResponse;

  void Dispatch(std::unique_ptr<v1::DecodeStreamRequest> request);
  // Serializes an answer and queues it; Queue takes one already written.
  void Answer(const Response& response);
  void Queue(std::unique_ptr<grpc::ByteBuffer> bytes);
  void StartReadLocked();
  // Reads the next request unless the stream holds max_in_flight requests and answers.
  void MaybeReadLocked();
  void StartWriteLocked();
  void MaybeFinishLocked();

  grpc::CallbackServerContext* const context_;
  Tenant* const tenant_;
  DecodeDispatcher& dispatcher_;
  ServiceMetrics& metrics_;
  CallRegistry& registry_;
  const int max_in_flight_;

  std::mutex mu_;
  grpc::ByteBuffer request_bytes_;  // the read buffer
  int64_t requests_read_ = 0;
  absl::Status ended_;  // not OK after a message that did not parse: the stream's status
  std::deque<std::unique_ptr<grpc::ByteBuffer>> writes_;  // front() is being written
  int in_flight_ = 0;                                     // dispatched, not yet answered
  bool reading_ = false;
  bool writing_ = false;
  bool reads_done_ = false;    // the client half-closed (or the call broke)
  bool write_failed_ = false;  // the client is gone: answers are dropped
  bool draining_ = false;
  bool finished_ = false;
  // Last: a drain may reach the stream as soon as it is registered.
  const absl::Status registration_;
  const bool registered_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_DECODE_STREAM_REACTOR_H_
