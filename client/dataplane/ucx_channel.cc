#include "client/dataplane/ucx_channel.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace mlaserve::client {
namespace {

// Most a caller driving the worker sleeps before it looks at its deadline again.
constexpr absl::Duration kPollSlice = absl::Milliseconds(100);
// Most a caller waiting for the one driving the worker sleeps before it looks again.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(5);

std::string HeaderOf(uint64_t call_id) {
  unsigned char header[ucx::kCallIdBytes];
  ucx::WriteCallId(call_id, header);
  return std::string(reinterpret_cast<const char*>(header), sizeof(header));
}

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

// "host:port" or "[v6]:port" split at the last colon.
absl::StatusOr<std::pair<std::string, int>> SplitAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("plane.address: '", address, "' is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxChannel>> UcxChannel::Open(
    const v1::OpenDataPlaneResponse& opened, const std::string& server_host,
    UcxChannelOptions options) {
  ASSIGN_OR_RETURN(auto where, SplitAddress(opened.plane().address()));
  if (IsWildcard(where.first)) where.first = server_host;
  ASSIGN_OR_RETURN(sockaddr_storage address,
                   ucx::ResolveSockaddr(where.first, where.second, "plane.address", false));
  ASSIGN_OR_RETURN(std::unique_ptr<ucx::UcxWorker> worker, ucx::UcxWorker::Create());
  std::unique_ptr<UcxChannel> channel(new UcxChannel(std::move(worker)));
  absl::Status connected = channel->Connect(address, opened.ticket(), options);
  if (!connected.ok()) {
    return absl::Status(connected.code(), absl::StrCat("data plane (ucx at ", where.first, ":",
                                                       where.second, "): ", connected.message()));
  }
  return channel;
}

UcxChannel::UcxChannel(std::unique_ptr<ucx::UcxWorker> worker)
    : worker_(std::move(worker)), wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

UcxChannel::~UcxChannel() {
  std::unique_lock lock(mu_);
  for (DeferredReceive& receive : std::exchange(deferred_, {})) {
    ucp_am_data_release(worker_->worker(), receive.descriptor);
  }
  if (ep_ != nullptr) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = broken_.ok() ? 0 : UCP_EP_CLOSE_FLAG_FORCE;  // a live server is told
    worker_->Wait(ucp_ep_close_nbx(ep_, &param), absl::Seconds(1));
  }
  worker_.reset();
  close(wake_);
}

absl::Status UcxChannel::Connect(const sockaddr_storage& address, const std::string& ticket,
                                 const UcxChannelOptions& options) {
  RETURN_IF_ERROR(worker_->SetAmHandler(ucx::kAmWelcome, &UcxChannel::OnWelcome, this));
  RETURN_IF_ERROR(worker_->SetAmHandler(ucx::kAmAnswer, &UcxChannel::OnAnswer, this));
  std::unique_lock lock(mu_);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
  params.sockaddr.addrlen =
      address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxChannel::OnEndpointError;
  params.err_handler.arg = this;
  if (ucs_status_t s = ucp_ep_create(worker_->worker(), &params, &ep_); s != UCS_OK) {
    ep_ = nullptr;
    return ucx::UcxError("connecting", s);
  }
  v1::UcxHello hello;
  hello.set_version(options.version);
  hello.set_ticket(ticket);
  auto pending = std::make_shared<Pending>();
  pending->request_bytes = std::make_shared<std::string>(hello.SerializeAsString());
  Send(ucx::kAmHello, "", pending, pending->request_bytes->size());
  const bool in_time =
      WaitFor(lock, absl::Now() + options.connect_timeout, [&] { return welcome_.has_value(); });
  if (!broken_.ok()) return broken_;
  if (!in_time) {
    return absl::UnavailableError(
        absl::StrCat("no welcome within ", absl::FormatDuration(options.connect_timeout)));
  }
  if (welcome_->status().code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(welcome_->status().code()),
                        welcome_->status().message());
  }
  instance_id_ = welcome_->instance_id();
  return absl::OkStatus();
}

bool UcxChannel::broken() const {
  std::lock_guard lock(mu_);
  return !broken_.ok();
}

void UcxChannel::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
}

void UcxChannel::Fail(const absl::Status& status) {
  if (broken_.ok()) broken_ = status;
  for (auto& [id, pending] : calls_) {
    if (pending->status.ok()) pending->status = status;
  }
}

void UcxChannel::Send(unsigned id, const std::string& header, std::shared_ptr<Pending> pending,
                      size_t size) {
  struct SendContext {
    std::shared_ptr<Pending> pending;
    std::string header;
  };
  auto* context = new SendContext{std::move(pending), header};
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  // The server answers on the endpoint the message names (its reply endpoint).
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.user_data = context;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    auto* sent = static_cast<SendContext*>(user_data);
    sent->pending->sent = true;
    if (status != UCS_OK && sent->pending->status.ok()) {
      sent->pending->status = ucx::UcxError("data plane: sending the call", status);
    }
    delete sent;
    if (request != nullptr) ucp_request_free(request);
  };
  ucs_status_ptr_t request =
      ucp_am_send_nbx(ep_, id, context->header.data(), context->header.size(),
                      context->pending->request_bytes->data(), size, &param);
  if (!UCS_PTR_IS_PTR(request)) param.cb.send(nullptr, UCS_PTR_STATUS(request), context);
}

template <typename Done>
bool UcxChannel::WaitFor(std::unique_lock<std::mutex>& lock, absl::Time deadline, Done done) {
  while (!done() && broken_.ok()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    if (progressing_) {
      progressed_.wait_until(lock, absl::ToChronoTime(std::min(deadline, now + kWaitSlice)));
      continue;
    }
    progressing_ = true;
    bool any = worker_->Progress();
    // Rendezvous answers are received outside UCX's callback, as UCX asks, into reused buffers.
    for (DeferredReceive& receive : std::exchange(deferred_, {})) {
      any = true;
      struct ReceiveContext {
        std::shared_ptr<Pending> pending;
        UcxChannel* channel;
      };
      Pending& pending = *receive.pending;
      pending.answer_bytes = buffers_->Take();
      if (pending.answer_bytes->size() < receive.length)
        pending.answer_bytes->resize(receive.length);
      pending.answer_length = receive.length;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.user_data = new ReceiveContext{receive.pending, this};
      param.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
        std::unique_ptr<ReceiveContext> context(static_cast<ReceiveContext*>(user_data));
        Pending& p = *context->pending;
        if (status != UCS_OK) {
          if (p.status.ok()) p.status = ucx::UcxError("data plane: receiving the answer", status);
        } else {
          p.answer = context->channel->answers_->Take();
          if (!p.answer->ParseFromArray(p.answer_bytes->data(),
                                        static_cast<int>(p.answer_length))) {
            p.status =
                absl::InternalError("data plane: the server's answer is not a DataPlaneAnswer");
          }
        }
        p.answered = true;
        p.answer_bytes.reset();
        if (request != nullptr) ucp_request_free(request);
      };
      ucs_status_ptr_t request =
          ucp_am_recv_data_nbx(worker_->worker(), receive.descriptor, pending.answer_bytes->data(),
                               receive.length, &param);
      if (!UCS_PTR_IS_PTR(request)) {
        param.cb.recv_am(nullptr, UCS_PTR_STATUS(request), receive.length, param.user_data);
      }
    }
    if (!any && !done() && broken_.ok() && worker_->Arm()) {
      lock.unlock();
      pollfd fds[2] = {{worker_->event_fd(), POLLIN, 0}, {wake_, POLLIN, 0}};
      const absl::Duration left = std::min(deadline - absl::Now(), kPollSlice);
      poll(fds, 2, static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(left) + 1)));
      if ((fds[1].revents & POLLIN) != 0) {
        uint64_t count;
        (void)!read(wake_, &count, sizeof(count));
      }
      lock.lock();
    }
    progressing_ = false;
    progressed_.notify_all();
  }
  return true;
}

absl::StatusOr<v1::DataPlaneAnswer*> UcxChannel::Exchange(const std::string& header,
                                                          std::shared_ptr<Pending> pending,
                                                          size_t size, uint64_t call_id,
                                                          absl::Time deadline) {
  std::unique_lock lock(mu_);
  if (!broken_.ok()) return broken_;
  calls_[call_id] = pending;
  Send(ucx::kAmCall, header, pending, size);
  if (progressing_) Wake();  // the caller driving the worker sleeps in poll: the send needs it
  const bool in_time = WaitFor(lock, deadline, [&] {
    return (pending->answered && pending->sent) || !pending->status.ok();
  });
  calls_.erase(call_id);  // a late answer finds no call and is dropped
  if (!pending->status.ok()) return pending->status;
  if (!in_time) return absl::DeadlineExceededError("data plane: no answer in time");
  return pending->answer.get();
}

absl::Status UcxChannel::Decode(const DecodeBatchRequest& request, DecodeBatchOutput& output,
                                absl::Duration timeout) {
  RETURN_IF_ERROR(CheckDecodeBatch(request));
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t call_id;
  {
    std::lock_guard lock(mu_);
    call_id = next_call_id_++;
  }
  v1::DataPlaneCall call;
  *call.mutable_request() = PackedDecodeRequest(request, 0, request.sequences());
  call.set_timeout_us(
      static_cast<uint64_t>(std::max<int64_t>(1, absl::ToInt64Microseconds(timeout))));
  call.set_call_id(call_id);
  auto pending = std::make_shared<Pending>();
  pending->request_bytes = buffers_->Take();
  const size_t size = call.ByteSizeLong();
  if (size > static_cast<size_t>(INT_MAX)) {
    return absl::FailedPreconditionError(
        absl::StrCat("data plane: the call takes ", size,
                     " bytes; split it (ClientOptions::decode_call_bytes)"));
  }
  if (pending->request_bytes->size() < size) pending->request_bytes->resize(size);
  call.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(pending->request_bytes->data()));
  ASSIGN_OR_RETURN(v1::DataPlaneAnswer * answer,
                   Exchange(HeaderOf(call_id), pending, size, call_id, deadline));
  if (answer->status().code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(answer->status().code()),
                        answer->status().message());
  }
  if (answer->call_id() != call_id) {
    return absl::InternalError(
        absl::StrCat("data plane: the answer names call ", answer->call_id(), ", not ", call_id));
  }
  output.plans.clear();
  return ReadBatchAnswers(request, *answer->mutable_response(), 0, request.sequences(), output);
}

absl::StatusOr<v1::DataPlaneAnswer> UcxChannel::CallRaw(const std::string& header,
                                                        const std::string& data,
                                                        absl::Duration timeout) {
  auto pending = std::make_shared<Pending>();
  pending->request_bytes = std::make_shared<std::string>(data);
  const uint64_t call_id = ucx::ReadCallId(header.data(), header.size()).value_or(0);
  ASSIGN_OR_RETURN(v1::DataPlaneAnswer * answer,
                   Exchange(header, pending, data.size(), call_id, absl::Now() + timeout));
  return *answer;
}

ucs_status_t UcxChannel::OnWelcome(void* arg, const void*, size_t, void* data, size_t length,
                                   const ucp_am_recv_param_t* param) {
  auto* channel = static_cast<UcxChannel*>(arg);
  v1::UcxWelcome welcome;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 && length <= ucx::kMaxHelloBytes &&
      welcome.ParseFromArray(data, static_cast<int>(length))) {
    channel->welcome_ = std::move(welcome);
  } else {
    channel->Fail(absl::InternalError("the server's welcome is not a UcxWelcome"));
  }
  return UCS_OK;
}

ucs_status_t UcxChannel::OnAnswer(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  auto* channel = static_cast<UcxChannel*>(arg);
  const uint64_t call_id = ucx::ReadCallId(header, header_length).value_or(0);
  auto it = channel->calls_.find(call_id);
  if (it == channel->calls_.end()) return UCS_OK;  // the call timed out: dropped
  std::shared_ptr<Pending> pending = it->second;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    channel->deferred_.push_back({pending, data, length});
    return UCS_INPROGRESS;
  }
  pending->answer = channel->answers_->Take();
  if (length > static_cast<size_t>(INT_MAX) ||
      !pending->answer->ParseFromArray(data, static_cast<int>(length))) {
    pending->status =
        absl::InternalError("data plane: the server's answer is not a DataPlaneAnswer");
  }
  pending->answered = true;
  return UCS_OK;
}

void UcxChannel::OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<UcxChannel*>(arg)->Fail(absl::UnavailableError(
      absl::StrCat("data plane: the UCX endpoint failed (", ucs_status_string(status),
                   "); the server stopped or restarted, or cannot be reached: open it again")));
}

}  // namespace mlaserve::client
