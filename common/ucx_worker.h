#ifndef MLASERVE_COMMON_UCX_WORKER_H_
#define MLASERVE_COMMON_UCX_WORKER_H_

#include <sys/socket.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ucp/api/ucp.h"

namespace mlaserve::ucx {

// A UCX context with one worker for active messages, woken through an event fd: what each
// side of the UCX data plane drives from its own thread(s). UCX reads its UCX_* environment
// (UCX_TLS, UCX_NET_DEVICES, ...) here. Not thread-safe: one thread at a time (the server's
// progress thread; the client's callers under its lock).
class UcxWorker {
 public:
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create();
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h worker() const { return worker_; }
  // Readable when the worker has something to progress (after Arm).
  int event_fd() const { return event_fd_; }
  // Progresses until the worker has nothing left; whether anything happened.
  bool Progress();
  // Arms the event fd; false if events are already pending (progress again instead of sleeping).
  bool Arm();
  // Waits (progressing) for `request` from a *_nbx call to end, at most `timeout`; its status.
  // A request still running at the deadline is cancelled and TIMED_OUT returned.
  ucs_status_t Wait(ucs_status_ptr_t request, absl::Duration timeout);
  absl::Status SetAmHandler(unsigned id, ucp_am_recv_callback_t callback, void* arg);

 private:
  UcxWorker(ucp_context_h context, ucp_worker_h worker, int event_fd)
      : context_(context), worker_(worker), event_fd_(event_fd) {}
  ucp_context_h context_;
  ucp_worker_h worker_;
  int event_fd_;
};

// UNAVAILABLE "what: UCX's name for the status".
absl::Status UcxError(absl::string_view what, ucs_status_t status);

// `host` (a name or address) and `port` as a socket address for UCX's listener or client
// endpoint; INVALID_ARGUMENT naming `flag` if it does not resolve.
absl::StatusOr<sockaddr_storage> ResolveSockaddr(const std::string& host, int port,
                                                 absl::string_view flag, bool passive);

// The port a socket address names.
int PortOf(const sockaddr_storage& address);

}  // namespace mlaserve::ucx

#endif  // MLASERVE_COMMON_UCX_WORKER_H_
