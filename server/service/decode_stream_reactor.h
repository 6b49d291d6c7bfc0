#ifndef MLASERVE_SERVER_SERVICE_DECODE_STREAM_REACTOR_H_
#define MLASERVE_SERVER_SERVICE_DECODE_STREAM_REACTOR_H_

#include <deque>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "grpcpp/support/server_callback.h"
#include "mlaserve/v1/decode.pb.h"
#include "server/service/decode_dispatcher.h"
#include "server/service/service_metrics.h"
#include "server/service/stream_registry.h"

namespace mlaserve::service {

// One DecodeStream: every request read is dispatched at once (a worker pipelines its
// layers), answers are written in completion order with their request ids, and a failed
// request is answered in-band while the stream stays open.
//
// Flow control: at most `max_in_flight` requests of a stream are in the engine at a time;
// past that the reactor stops reading, so a client that outpaces the server is held back by
// HTTP/2 flow control instead of growing the engine's queue.
//
// Ending: after the client half-closes, once every answer is written (OK); when the server
// drains, once the requests already taken are answered (UNAVAILABLE, so the worker
// reconnects elsewhere); if the client goes away, once the engine has returned every
// request (they are cancelled through the call's context). The reactor deletes itself when
// the call is done.
class DecodeStreamReactor
    : public grpc::ServerBidiReactor<v1::DecodeStreamRequest, v1::DecodeStreamResponse>,
      public DrainableStream {
 public:
  DecodeStreamReactor(grpc::CallbackServerContext* context, DecodeDispatcher& dispatcher,
                      ServiceMetrics& metrics, StreamRegistry& registry, int max_in_flight);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;
  void Drain() override;

 private:
  using Response = v1::DecodeStreamResponse;

  void Dispatch(std::unique_ptr<v1::DecodeStreamRequest> request);
  void Answer(std::unique_ptr<Response> response);
  void StartReadLocked();
  void StartWriteLocked();
  void MaybeFinishLocked();

  grpc::CallbackServerContext* const context_;
  DecodeDispatcher& dispatcher_;
  ServiceMetrics& metrics_;
  StreamRegistry& registry_;
  const int max_in_flight_;
  const bool registered_;

  std::mutex mu_;
  v1::DecodeStreamRequest request_;               // the read buffer
  std::deque<std::unique_ptr<Response>> writes_;  // front() is being written when writing_
  int in_flight_ = 0;                             // dispatched, not yet answered
  bool reading_ = false;
  bool writing_ = false;
  bool reads_done_ = false;    // the client half-closed (or the call broke)
  bool write_failed_ = false;  // the client is gone: answers are dropped
  bool draining_ = false;
  bool finished_ = false;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_DECODE_STREAM_REACTOR_H_
