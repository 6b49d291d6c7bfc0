#include "server/dataplane/ucx_data_plane.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/ucx_wire.h"
#include "server/dataplane/ucx_call.h"
#include "spdlog/spdlog.h"

namespace mlaserve::dataplane {
namespace {

// A client that connects and says nothing is closed after this (it holds one of max_clients).
constexpr absl::Duration kUcxHelloTimeout = absl::Seconds(10);
// Most the plane waits at its end for answers already written to leave.
constexpr absl::Duration kFlushTimeout = absl::Seconds(2);

void SetWelcomeStatus(const absl::Status& status, v1::RequestStatus* wire) {
  wire->set_code(static_cast<int>(status.code()));
  wire->set_message(std::string(status.message()));
}

struct ReceiveContext {
  UcxDataPlane* plane;
  UcxDataPlane::PendingReceive call;
  std::shared_ptr<std::string> buffer;
};

struct SendContext {
  int* sends_in_flight;
  std::shared_ptr<std::string> bytes;
  unsigned char header[ucx::kCallIdBytes];
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxDataPlane>> UcxDataPlane::Start(
    UcxDataPlaneOptions options, service::DecodeDispatcher& dispatcher,
    service::DataPlaneTickets& tickets, service::ServiceMetrics& metrics) {
  absl::StatusOr<std::unique_ptr<ucx::UcxWorker>> worker = ucx::UcxWorker::Create();
  if (!worker.ok()) {
    return absl::Status(worker.status().code(),
                        absl::StrCat("--data_plane_ucx: ", worker.status().message()));
  }
  std::unique_ptr<UcxDataPlane> plane(
      new UcxDataPlane(std::move(options), *std::move(worker), dispatcher, tickets, metrics));
  RETURN_IF_ERROR(plane->Listen());
  plane->progress_ = std::thread([p = plane.get()] { p->Run(); });
  return plane;
}

UcxDataPlane::UcxDataPlane(UcxDataPlaneOptions options, std::unique_ptr<ucx::UcxWorker> worker,
                           service::DecodeDispatcher& dispatcher,
                           service::DataPlaneTickets& tickets, service::ServiceMetrics& metrics)
    : options_(std::move(options)),
      worker_(std::move(worker)),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      dispatcher_(dispatcher),
      tickets_(tickets),
      metrics_(metrics),
      budget_(options_.caps, kUcxCallWording) {}

absl::Status UcxDataPlane::Listen() {
  const std::string where = absl::StrCat(options_.host, ":", options_.port);
  ASSIGN_OR_RETURN(sockaddr_storage address,
                   ucx::ResolveSockaddr(options_.host, options_.port, "--data_plane_ucx", true));
  RETURN_IF_ERROR(worker_->SetAmHandler(ucx::kAmHello, &UcxDataPlane::OnHello, this));
  RETURN_IF_ERROR(worker_->SetAmHandler(ucx::kAmCall, &UcxDataPlane::OnCall, this));
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
  params.sockaddr.addrlen =
      address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  params.conn_handler.cb = &UcxDataPlane::OnConnection;
  params.conn_handler.arg = this;
  if (ucs_status_t s = ucp_listener_create(worker_->worker(), &params, &listener_); s != UCS_OK) {
    listener_ = nullptr;
    return ucx::UcxError(absl::StrCat("--data_plane_ucx: cannot listen on ", where), s);
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucs_status_t s = ucp_listener_query(listener_, &attr); s != UCS_OK) {
    return ucx::UcxError("--data_plane_ucx: the listener's address", s);
  }
  port_ = ucx::PortOf(attr.sockaddr);
  spdlog::info("data plane: UCX listening on {}:{}", options_.host, port_);
  return absl::OkStatus();
}

UcxDataPlane::~UcxDataPlane() {
  stopping_.store(true);
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
  if (progress_.joinable()) progress_.join();
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  worker_.reset();
  close(wake_);
}

v1::DataPlane UcxDataPlane::Advertised() const {
  v1::DataPlane plane;
  plane.set_kind("ucx");
  plane.set_address(absl::StrContains(options_.host, ':')
                        ? absl::StrCat("[", options_.host, "]:", port_)
                        : absl::StrCat(options_.host, ":", port_));
  plane.set_version(ucx::kUcxVersion);
  plane.set_host_id(options_.host_id);
  return plane;
}

void UcxDataPlane::Drain() {
  absl::MutexLock lock(&handing_mu_);  // waits for a call being handed to the engine
  draining_ = true;
  handing_mu_.AwaitWithTimeout(absl::Condition(
                                   +[](int* receiving) { return *receiving == 0; }, &receiving_),
                               absl::Seconds(5));
}

void UcxDataPlane::Abandon(const std::shared_ptr<UcxConnection>& connection, size_t bytes) {
  budget_.Give(connection->tenant, bytes);
  connection->in_flight.fetch_sub(1);
  calls_in_flight_.fetch_sub(1);
  absl::MutexLock lock(&handing_mu_);
  --receiving_;
}

void UcxDataPlane::Run() {
  absl::Time stop_by = absl::InfiniteFuture();
  absl::Time next_hello_check = absl::Now() + absl::Seconds(1);
  for (;;) {
    bool busy = worker_->Progress();
    // Rendezvous data is received outside UCX's callback, as UCX asks, into a reused buffer.
    for (PendingReceive& call : std::exchange(pending_, {})) {
      busy = true;
      if (call.connection->gone.load()) {
        ucp_am_data_release(worker_->worker(), call.descriptor);
        Abandon(call.connection, call.length);
        continue;
      }
      auto* context = new ReceiveContext{this, call, call.connection->buffers->Take()};
      if (context->buffer->size() < call.length) context->buffer->resize(call.length);
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.recv_am = &UcxDataPlane::OnReceived;
      param.user_data = context;
      ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_->worker(), call.descriptor,
                                                      context->buffer->data(), call.length, &param);
      if (!UCS_PTR_IS_PTR(request)) OnReceived(nullptr, UCS_PTR_STATUS(request), 0, context);
    }
    busy = SendQueued() || busy;
    for (std::shared_ptr<UcxConnection>& failed : std::exchange(failed_, {})) Close(failed, true);
    CloseFinished();
    const absl::Time now = absl::Now();
    if (now >= next_hello_check) {
      next_hello_check = now + absl::Seconds(1);
      std::vector<std::shared_ptr<UcxConnection>> silent;
      for (const auto& [ep, connection] : by_ep_) {
        if (!connection->registered && connection->hello_by < now) silent.push_back(connection);
      }
      for (const auto& connection : silent) {
        spdlog::info("data plane: closing a UCX client that sent no hello within {}",
                     absl::FormatDuration(kUcxHelloTimeout));
        Close(connection, true);
      }
    }
    if (stopping_.load()) {
      if (stop_by == absl::InfiniteFuture()) stop_by = now + kFlushTimeout;
      std::lock_guard lock(queue_mu_);
      if ((queue_.empty() && sends_in_flight_ == 0) || now > stop_by) break;
    }
    if (busy || !worker_->Arm()) continue;
    pollfd fds[2] = {{worker_->event_fd(), POLLIN, 0}, {wake_, POLLIN, 0}};
    poll(fds, 2, stopping_.load() ? 10 : 1000);
    if ((fds[1].revents & POLLIN) != 0) {
      uint64_t count;
      (void)!read(wake_, &count, sizeof(count));
    }
  }
  // Every endpoint closed, and their close requests ended (bounded: a peer may be gone or
  // slow to take its last answer).
  std::vector<std::shared_ptr<UcxConnection>> open;
  for (const auto& [ep, connection] : by_ep_) open.push_back(connection);
  // A flushing close for a client answered during the drain (an answer whose send completed
  // may still sit in a socket buffer); the others at once (a flush waits for the client to
  // progress, which an idle one does not).
  for (const auto& connection : open) {
    Close(connection, connection->gone.load() || !connection->answered_in_drain);
  }
  const absl::Time close_by = absl::Now() + absl::Seconds(1);
  while (!closing_.empty() && absl::Now() < close_by) {
    worker_->Progress();
    CloseFinished();
  }
  for (void* request : std::exchange(closing_, {})) ucp_request_free(request);
}

void UcxDataPlane::CloseFinished() {
  std::erase_if(closing_, [](void* request) {
    if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
    ucp_request_free(request);
    return true;
  });
}

void UcxDataPlane::Close(const std::shared_ptr<UcxConnection>& connection, bool force) {
  if (by_ep_.erase(connection->ep) == 0) return;
  connection->gone.store(true);
  if (connection->registered) clients_.fetch_sub(1, std::memory_order_relaxed);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(connection->ep, &param);
  if (UCS_PTR_IS_PTR(request)) closing_.push_back(request);
}

bool UcxDataPlane::SendQueued() {
  std::vector<Outgoing> queued;
  {
    std::lock_guard lock(queue_mu_);
    queued.swap(queue_);
  }
  bool draining = false;
  if (!queued.empty()) {
    absl::MutexLock lock(&handing_mu_);
    draining = draining_;
  }
  for (Outgoing& out : queued) {
    UcxConnection& connection = *out.connection;
    if (draining) connection.answered_in_drain = true;
    if (connection.gone.load() || !by_ep_.contains(connection.ep)) continue;
    auto* context = new SendContext{&sends_in_flight_, std::move(out.bytes), {}};
    size_t header_bytes = 0;
    if (out.id == ucx::kAmAnswer) {
      ucx::WriteCallId(out.call_id, context->header);
      header_bytes = ucx::kCallIdBytes;
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxDataPlane::OnSent;
    param.user_data = context;
    ++sends_in_flight_;
    ucs_status_ptr_t request = ucp_am_send_nbx(connection.ep, out.id, context->header, header_bytes,
                                               context->bytes->data(), out.size, &param);
    if (!UCS_PTR_IS_PTR(request)) OnSent(nullptr, UCS_PTR_STATUS(request), context);
    // A refused hello's endpoint is left to its client, which closes it on reading why (a
    // close from here could overtake the welcome); one that lingers is closed with the
    // clients that sent no hello.
  }
  return !queued.empty();
}

void UcxDataPlane::OnSent(void* request, ucs_status_t, void* user_data) {
  auto* context = static_cast<SendContext*>(user_data);
  --*context->sends_in_flight;
  delete context;
  if (request != nullptr) ucp_request_free(request);
}

void UcxDataPlane::Queue(const std::shared_ptr<UcxConnection>& connection, unsigned id,
                         uint64_t call_id, std::shared_ptr<std::string> bytes, size_t size) {
  {
    std::lock_guard lock(queue_mu_);
    queue_.push_back({connection, id, call_id, std::move(bytes), size});
  }
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
}

void UcxDataPlane::OnConnection(ucp_conn_request_h request, void* arg) {
  auto* plane = static_cast<UcxDataPlane*>(arg);
  if (plane->stopping_.load() ||
      static_cast<int>(plane->by_ep_.size()) >= plane->options_.max_clients) {
    spdlog::warn("data plane: refusing a UCX client: {} clients already (the most it takes)",
                 plane->by_ep_.size());
    ucp_listener_reject(plane->listener_, request);
    return;
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxDataPlane::OnEndpointError;
  params.err_handler.arg = plane;
  ucp_ep_h ep = nullptr;
  if (ucs_status_t s = ucp_ep_create(plane->worker_->worker(), &params, &ep); s != UCS_OK) {
    spdlog::warn("data plane: cannot accept a UCX client: {}", ucs_status_string(s));
    return;
  }
  plane->by_ep_[ep] = std::make_shared<UcxConnection>(ep, absl::Now() + kUcxHelloTimeout);
}

void UcxDataPlane::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* plane = static_cast<UcxDataPlane*>(arg);
  auto it = plane->by_ep_.find(ep);
  if (it == plane->by_ep_.end()) return;
  spdlog::debug("data plane: a UCX client's endpoint failed ({}); its calls are cancelled",
                ucs_status_string(status));
  it->second->gone.store(true);  // its calls in flight see it at once
  plane->failed_.push_back(it->second);
}

std::shared_ptr<UcxConnection> UcxDataPlane::ConnectionOf(const ucp_am_recv_param_t* param) const {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return nullptr;
  auto it = by_ep_.find(param->reply_ep);
  if (it == by_ep_.end() || it->second->gone.load()) return nullptr;
  return it->second;
}

ucs_status_t UcxDataPlane::OnHello(void* arg, const void*, size_t, void* data, size_t length,
                                   const ucp_am_recv_param_t* param) {
  auto* plane = static_cast<UcxDataPlane*>(arg);
  // Without the reply flag there is no endpoint to answer; a hello sent by rendezvous is far
  // longer than any hello.
  std::shared_ptr<UcxConnection> connection = plane->ConnectionOf(param);
  if (connection == nullptr) return UCS_OK;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) length = ucx::kMaxHelloBytes + 1;
  plane->Hello(connection, (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? nullptr : data,
               length);
  return UCS_OK;
}

void UcxDataPlane::Hello(const std::shared_ptr<UcxConnection>& connection, const void* data,
                         size_t length) {
  const absl::Status status = [&]() -> absl::Status {
    if (connection->registered) return absl::FailedPreconditionError("hello: already presented");
    v1::UcxHello hello;
    if (data == nullptr || length > ucx::kMaxHelloBytes ||
        !hello.ParseFromArray(data, static_cast<int>(length))) {
      return absl::InvalidArgumentError(
          absl::StrCat("hello: ", length, " bytes that are not a UcxHello"));
    }
    if (hello.version() != ucx::kUcxVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("version: the client speaks ucx data-plane version ", hello.version(),
                       "; this server speaks version ", ucx::kUcxVersion));
    }
    ASSIGN_OR_RETURN(service::Tenant * tenant, tickets_.Redeem(hello.ticket()));
    connection->tenant = tenant;
    connection->registered = true;
    clients_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }();
  if (!status.ok() && !connection->registered) {
    spdlog::info("data plane: refused a UCX client: {}", status.ToString());
  }
  v1::UcxWelcome welcome;
  SetWelcomeStatus(status, welcome.mutable_status());
  welcome.set_version(ucx::kUcxVersion);
  welcome.set_instance_id(options_.instance_id);
  auto bytes = std::make_shared<std::string>(welcome.SerializeAsString());
  const size_t size = bytes->size();
  Queue(connection, ucx::kAmWelcome, 0, std::move(bytes), size);
}

ucs_status_t UcxDataPlane::OnCall(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  auto* plane = static_cast<UcxDataPlane*>(arg);
  const absl::Time start = absl::Now();
  std::shared_ptr<UcxConnection> connection = plane->ConnectionOf(param);
  if (connection == nullptr) return UCS_OK;  // no one to answer: its data is dropped
  const std::optional<uint64_t> call_id = ucx::ReadCallId(header, header_length);
  absl::Status refused;
  if (!call_id.has_value()) {
    refused = absl::InvalidArgumentError(
        absl::StrCat("header: ", header_length, " bytes; a call's header is its 8-byte call id"));
  } else if (!connection->registered) {
    refused = absl::UnauthenticatedError(
        "hello: present the OpenDataPlane ticket (a UcxHello) before any call");
  } else {
    // Taken here, or refused: a call taken before a drain reaches the engine however long its
    // bytes take to arrive (Drain waits for them); one after it is refused.
    absl::MutexLock lock(&plane->handing_mu_);
    refused = plane->draining_
                  ? absl::UnavailableError("the server is shutting down; call another replica")
                  : plane->budget_.Take(connection->tenant, length);
    if (refused.ok()) ++plane->receiving_;
  }
  if (!refused.ok()) {
    plane->Refuse(connection, call_id.value_or(0), refused, start);
    return UCS_OK;  // a rendezvous call's data is dropped unread
  }
  connection->in_flight.fetch_add(1);
  plane->calls_in_flight_.fetch_add(1);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    plane->pending_.push_back({connection, *call_id, data, length, start});
    return UCS_INPROGRESS;
  }
  plane->RunCall(connection, *call_id, data, length, length, start);
  return UCS_OK;
}

void UcxDataPlane::OnReceived(void* request, ucs_status_t status, size_t, void* user_data) {
  std::unique_ptr<ReceiveContext> context(static_cast<ReceiveContext*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  UcxDataPlane& plane = *context->plane;
  const PendingReceive& call = context->call;
  if (status != UCS_OK) {
    plane.Abandon(call.connection, call.length);
    if (!call.connection->gone.load()) {
      plane.Refuse(call.connection, call.call_id, ucx::UcxError("call: its data", status),
                   call.start);
    }
    return;
  }
  plane.RunCall(call.connection, call.call_id, context->buffer->data(), call.length, call.length,
                call.start);
}

void UcxDataPlane::Refuse(const std::shared_ptr<UcxConnection>& connection, uint64_t call_id,
                          const absl::Status& status, absl::Time start) {
  std::shared_ptr<std::string> bytes = connection->buffers->Take();
  size_t size = 0;
  WriteUcxAnswer(call_id, status, *bytes, &size).IgnoreError();
  metrics_.RecordRpc("Decode", status.code(), absl::Now() - start, "ucx");
  Queue(connection, ucx::kAmAnswer, call_id, std::move(bytes), size);
}

void UcxDataPlane::RunCall(const std::shared_ptr<UcxConnection>& connection, uint64_t call_id,
                           const void* data, size_t length, uint64_t taken, absl::Time start) {
  auto end_call = [this, connection, taken] {
    budget_.Give(connection->tenant, taken);
    connection->in_flight.fetch_sub(1);
    calls_in_flight_.fetch_sub(1);
  };
  absl::StatusOr<UcxCall> parsed =
      ParseUcxCall(call_id, data, length, connection->messages->Take());
  // A taken call is handed to the engine before Drain returns: the engine's own drain, which
  // follows, then waits for it instead of refusing it.
  absl::MutexLock handing(&handing_mu_);
  --receiving_;
  if (!parsed.ok()) {
    end_call();
    Refuse(connection, call_id, parsed.status(), start);
    return;
  }
  dispatcher_.Dispatch(
      std::move(parsed->call), connection->tenant, parsed->deadline,
      [connection] { return connection->gone.load(std::memory_order_relaxed); },
      [this, connection, call_id, start,
       end_call](absl::StatusOr<service::AnsweredDecode> answered) {
        std::shared_ptr<std::string> bytes = connection->buffers->Take();
        size_t size = 0;
        absl::Status status = WriteUcxAnswer(call_id, answered, *bytes, &size);
        if (connection->gone.load()) {
          status = absl::CancelledError("the client's endpoint closed");
        }
        metrics_.RecordRpc("Decode", status.code(), absl::Now() - start, "ucx");
        if (!connection->gone.load()) {
          Queue(connection, ucx::kAmAnswer, call_id, std::move(bytes), size);
        }
        end_call();
      });
}

}  // namespace mlaserve::dataplane
