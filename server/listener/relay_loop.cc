#include "server/listener/relay_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mlaserve::listener {
namespace {

constexpr uint64_t kWakeToken = ~uint64_t{0};
// How long a connection the guard or gRPC ended may take to pass its last bytes (a GOAWAY,
// gRPC's final answers) to a client that does not read them.
constexpr absl::Duration kDrainGrace = absl::Milliseconds(500);
constexpr size_t kReadChunk = 64 * 1024;

uint64_t Token(uint64_t id, int side) { return (id << 1) | static_cast<uint64_t>(side); }

// Writes what it can of `buffer` past `sent`; false when the socket is gone.
bool WritePending(int fd, std::string& buffer, size_t& sent) {
  while (sent < buffer.size()) {
    // send(), not write(): a peer gone mid-write is EPIPE here, not SIGPIPE for the process.
    const ssize_t n = send(fd, buffer.data() + sent, buffer.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return false;
  }
  if (sent == buffer.size()) {
    buffer.clear();
    sent = 0;
  } else if (sent > kReadChunk) {
    buffer.erase(0, sent);
    sent = 0;
  }
  return true;
}

}  // namespace

struct RelayLoop::Connection {
  Connection(AcceptedConnection accepted, const Http2GuardLimits& limits, absl::Time now)
      : info(std::move(accepted)), guard(limits, info.rates, now) {}
  size_t PendingToClient() const { return out.to_client.size() - to_client_sent; }
  size_t PendingToServer() const { return out.to_server.size() - to_server_sent; }

  AcceptedConnection info;
  Http2Guard guard;
  GuardOutput out;
  size_t to_client_sent = 0;
  size_t to_server_sent = 0;
  std::optional<GuardClose> closed_by;
  // Nothing more is read: what is owed to the client goes out, then the connection ends.
  bool draining = false;
  absl::Time drain_deadline;
  uint32_t client_events = 0;
  uint32_t grpc_events = 0;
};

RelayLoop::RelayLoop(const Http2GuardLimits& limits, size_t max_buffered_bytes,
                     ConnectionOwner& owner)
    : limits_(limits), max_buffered_bytes_(max_buffered_bytes), owner_(owner) {}

RelayLoop::~RelayLoop() {
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, connection] : connections_) ids.push_back(id);
  for (uint64_t id : ids) Finish(id);
  absl::MutexLock lock(&mu_);
  for (const AcceptedConnection& c : incoming_) {
    close(c.client_fd);
    close(c.grpc_fd);
  }
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::Status RelayLoop::Start() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("relay loop: ", std::strerror(errno)));
  }
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.u64 = kWakeToken;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake) != 0) {
    return absl::InternalError(absl::StrCat("relay loop: ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void RelayLoop::Add(AcceptedConnection connection) {
  {
    absl::MutexLock lock(&mu_);
    incoming_.push_back(std::move(connection));
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void RelayLoop::Run() {
  epoll_event events[64];
  while (!stopping_) {
    const bool any_draining = draining_ > 0;
    const int n = epoll_wait(epoll_fd_, events, 64, any_draining ? 100 : -1);
    for (int i = 0; i < n; ++i) {
      const uint64_t token = events[i].data.u64;
      if (token == kWakeToken) {
        TakeNew();
        continue;
      }
      auto it = connections_.find(token >> 1);
      if (it == connections_.end()) continue;
      Connection& c = *it->second;
      const bool client_side = (token & 1) == 0;
      const uint32_t ready = events[i].events;
      const uint32_t wanted = client_side ? c.client_events : c.grpc_events;
      if ((ready & (EPOLLHUP | EPOLLERR)) != 0 && (wanted & EPOLLIN) == 0) {
        // A peer gone while its reads were held back: nothing it sent will be wanted.
        if (client_side) {
          Finish(c.info.id);
          continue;
        }
        CloseGrpcSide(c);
      } else if ((ready & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) {
        if (client_side) {
          ReadClient(c);
        } else {
          ReadGrpc(c);
        }
        if (c.info.client_fd < 0) {
          Finish(c.info.id);
          continue;
        }
      }
      Flush(c);
    }
    if (any_draining) {
      const absl::Time now = absl::Now();
      std::vector<uint64_t> expired;
      for (const auto& [id, c] : connections_) {
        if (c->draining && now > c->drain_deadline) expired.push_back(id);
      }
      for (uint64_t id : expired) Finish(id);
    }
  }
}

void RelayLoop::TakeNew() {
  uint64_t count;
  (void)!read(wake_fd_, &count, sizeof(count));
  std::vector<AcceptedConnection> incoming;
  {
    absl::MutexLock lock(&mu_);
    incoming.swap(incoming_);
    stopping_ = stop_;
  }
  const absl::Time now = absl::Now();
  for (AcceptedConnection& accepted : incoming) {
    const uint64_t id = accepted.id;
    auto connection = std::make_unique<Connection>(std::move(accepted), limits_, now);
    Connection& c = *connection;
    connections_.emplace(id, std::move(connection));
    epoll_event client{};
    client.events = c.client_events = EPOLLIN;
    client.data.u64 = Token(id, 0);
    epoll_event grpc{};
    grpc.events = c.grpc_events = EPOLLIN;
    grpc.data.u64 = Token(id, 1);
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.info.client_fd, &client) != 0 ||
        epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.info.grpc_fd, &grpc) != 0) {
      Finish(id);
    }
  }
}

void RelayLoop::ReadClient(Connection& c) {
  char buffer[kReadChunk];
  const ssize_t n = read(c.info.client_fd, buffer, sizeof(buffer));
  if (n > 0) {
    if (c.draining) return;  // the guard ended it: nothing more goes to gRPC
    if (std::optional<GuardClose> closed = c.guard.FromClient(
            std::string_view(buffer, static_cast<size_t>(n)), absl::Now(), c.out)) {
      c.closed_by = closed;
      CloseGrpcSide(c);  // gRPC cancels the connection's calls
    }
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  // The client is gone: so is everything gRPC still had to say to it.
  close(c.info.client_fd);
  c.info.client_fd = -1;
}

void RelayLoop::ReadGrpc(Connection& c) {
  char buffer[kReadChunk];
  const ssize_t n = read(c.info.grpc_fd, buffer, sizeof(buffer));
  if (n > 0) {
    c.guard.FromServer(std::string_view(buffer, static_cast<size_t>(n)), c.out);
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  CloseGrpcSide(c);  // gRPC ended the connection (a GOAWAY it sent goes on first)
}

void RelayLoop::CloseGrpcSide(Connection& c) {
  if (c.info.grpc_fd >= 0) {
    close(c.info.grpc_fd);
    c.info.grpc_fd = -1;
    c.grpc_events = 0;
  }
  c.out.to_server.clear();
  c.to_server_sent = 0;
  if (!c.draining) {
    c.draining = true;
    ++draining_;
    c.drain_deadline = absl::Now() + kDrainGrace;
  }
}

void RelayLoop::Flush(Connection& c) {
  if (c.info.grpc_fd >= 0 && !WritePending(c.info.grpc_fd, c.out.to_server, c.to_server_sent)) {
    CloseGrpcSide(c);
  }
  if (!WritePending(c.info.client_fd, c.out.to_client, c.to_client_sent) ||
      (c.draining && c.PendingToClient() == 0)) {
    Finish(c.info.id);
    return;
  }
  Watch(c);
}

void RelayLoop::Watch(Connection& c) {
  uint32_t client = 0;
  if (!c.draining && c.PendingToServer() <= max_buffered_bytes_) client |= EPOLLIN;
  if (c.draining) client |= EPOLLIN;  // read and dropped, so a closing client is seen
  if (c.PendingToClient() > 0) client |= EPOLLOUT;
  if (client != c.client_events) {
    epoll_event event{};
    event.events = c.client_events = client;
    event.data.u64 = Token(c.info.id, 0);
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.info.client_fd, &event);
  }
  if (c.info.grpc_fd < 0) return;
  uint32_t grpc = 0;
  if (c.PendingToClient() <= max_buffered_bytes_) grpc |= EPOLLIN;
  if (c.PendingToServer() > 0) grpc |= EPOLLOUT;
  if (grpc != c.grpc_events) {
    epoll_event event{};
    event.events = c.grpc_events = grpc;
    event.data.u64 = Token(c.info.id, 1);
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.info.grpc_fd, &event);
  }
}

void RelayLoop::Finish(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = *it->second;
  if (c.info.client_fd >= 0) close(c.info.client_fd);
  if (c.info.grpc_fd >= 0) close(c.info.grpc_fd);
  if (c.draining) --draining_;
  owner_.Closed(c.info, c.closed_by, c.guard);
  connections_.erase(it);
}

}  // namespace mlaserve::listener
