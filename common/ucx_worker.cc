#include "common/ucx_worker.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace mlaserve::ucx {

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create() {
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcxError("UCX configuration (UCX_* variables)", s);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  ucp_context_h context = nullptr;
  const ucs_status_t initialised = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (initialised != UCS_OK) return UcxError("UCX context", initialised);
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  if (ucs_status_t s = ucp_worker_create(context, &worker_params, &worker); s != UCS_OK) {
    ucp_cleanup(context);
    return UcxError("UCX worker", s);
  }
  int event_fd = -1;
  if (ucs_status_t s = ucp_worker_get_efd(worker, &event_fd); s != UCS_OK) {
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return UcxError("UCX worker's event fd", s);
  }
  return std::unique_ptr<UcxWorker>(new UcxWorker(context, worker, event_fd));
}

UcxWorker::~UcxWorker() {
  ucp_worker_destroy(worker_);  // closes event_fd_ with it
  ucp_cleanup(context_);
}

bool UcxWorker::Progress() {
  bool any = false;
  while (ucp_worker_progress(worker_) != 0) any = true;
  return any;
}

bool UcxWorker::Arm() { return ucp_worker_arm(worker_) == UCS_OK; }

ucs_status_t UcxWorker::Wait(ucs_status_ptr_t request, absl::Duration timeout) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  const absl::Time deadline = absl::Now() + timeout;
  ucs_status_t status;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    if (Progress()) continue;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      ucp_request_cancel(worker_, request);
      Progress();
      ucp_request_free(request);
      return UCS_ERR_TIMED_OUT;
    }
    if (Arm()) {
      pollfd fd{event_fd_, POLLIN, 0};
      poll(&fd, 1, static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 100)));
    }
  }
  ucp_request_free(request);
  return status;
}

absl::Status UcxWorker::SetAmHandler(unsigned id, ucp_am_recv_callback_t callback, void* arg) {
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                     UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  param.id = id;
  param.cb = callback;
  param.arg = arg;
  param.flags = UCP_AM_FLAG_WHOLE_MSG;
  if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &param); s != UCS_OK) {
    return UcxError(absl::StrCat("UCX active message handler ", id), s);
  }
  return absl::OkStatus();
}

absl::StatusOr<sockaddr_storage> ResolveSockaddr(const std::string& host, int port,
                                                 absl::string_view flag, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int e = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); e != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot resolve '", host, "': ", gai_strerror(e)));
  }
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  return address;
}

int PortOf(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
}

}  // namespace mlaserve::ucx
