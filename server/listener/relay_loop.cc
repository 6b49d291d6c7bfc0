#include "server/listener/relay_loop.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "openssl/err.h"
#include "openssl/ssl.h"
#include "openssl/x509.h"
#include "spdlog/spdlog.h"

namespace mlaserve::listener {
namespace {

constexpr uint64_t kWakeToken = ~uint64_t{0};
// How long a connection the guard or gRPC ended may take to pass its last bytes (a GOAWAY,
// gRPC's final answers) to a client that does not read them.
constexpr absl::Duration kDrainGrace = absl::Milliseconds(500);
constexpr size_t kReadChunk = 64 * 1024;

uint64_t Token(uint64_t id, int side) { return (id << 1) | static_cast<uint64_t>(side); }

// Drops what was sent from the front of `buffer` once it is all sent or worth moving.
void Compact(std::string& buffer, size_t& sent) {
  if (sent == buffer.size()) {
    buffer.clear();
    sent = 0;
  } else if (sent > kReadChunk) {
    buffer.erase(0, sent);
    sent = 0;
  }
}

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
  Compact(buffer, sent);
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
  Http2Guard::Counters reported;  // what ReportCounters has handed the owner
  // Nothing more is read: what is owed to the client goes out, then the connection ends.
  bool draining = false;
  absl::Time drain_deadline;
  // TLS: the handshake is done (always, in plaintext), and OpenSSL waits for the socket to
  // take bytes before it can go on.
  bool handshaken = true;
  absl::Time handshake_deadline;
  bool tls_wants_write = false;
  uint32_t client_events = 0;
  uint32_t grpc_events = 0;
};

RelayLoop::RelayLoop(const Http2GuardLimits& limits, size_t max_buffered_bytes,
                     absl::Duration handshake_timeout, ConnectionOwner& owner)
    : limits_(limits),
      max_buffered_bytes_(max_buffered_bytes),
      handshake_timeout_(handshake_timeout),
      owner_(owner) {}

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
    if (c.ssl != nullptr) SSL_free(c.ssl);
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
  // OpenSSL writes with write(), which raises SIGPIPE on a socket whose peer is gone (a client
  // that closes right after its handshake, as the server sends its session tickets). Blocked
  // on this thread, the write fails with EPIPE instead of ending the process.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  epoll_event events[64];
  while (!stopping_) {
    const bool any_timed = timed_ > 0;
    const int n = epoll_wait(epoll_fd_, events, 64, any_timed ? 100 : -1);
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
      } else if ((ready & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0 ||
                 (client_side && c.info.ssl != nullptr)) {
        // (OpenSSL may wait on a writable socket to go on reading or handshaking.)
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
    if (any_timed) {
      const absl::Time now = absl::Now();
      std::vector<uint64_t> expired;
      for (const auto& [id, c] : connections_) {
        if ((c->draining && now > c->drain_deadline) ||
            (!c->handshaken && now > c->handshake_deadline)) {
          expired.push_back(id);
        }
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
    if (c.info.ssl != nullptr) {
      c.handshaken = false;
      c.handshake_deadline = now + handshake_timeout_;
      ++timed_;
    }
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

ssize_t RelayLoop::ReceiveFromClient(Connection& c, char* buffer, size_t size) {
  if (c.info.ssl == nullptr) {
    const ssize_t n = read(c.info.client_fd, buffer, size);
    if (n > 0) return n;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return -1;
    return 0;
  }
  c.tls_wants_write = false;
  // SSL_get_error reads this thread's error queue, which other connections share: it must be
  // empty before each operation.
  ERR_clear_error();
  if (!c.handshaken) {
    const int done = SSL_do_handshake(c.info.ssl);
    if (done != 1) {
      const int error = SSL_get_error(c.info.ssl, done);
      if (error == SSL_ERROR_WANT_READ) return -1;
      if (error == SSL_ERROR_WANT_WRITE) {
        c.tls_wants_write = true;
        return -1;
      }
      spdlog::debug("listener: TLS handshake with {} failed: {}", c.info.peer,
                    ERR_error_string(ERR_peek_error(), nullptr));
      ERR_clear_error();
      return 0;  // a failed handshake (no or an unverified certificate, not TLS): closed
    }
    c.handshaken = true;
    --timed_;
    std::string common_name;
    if (X509* peer = SSL_get_peer_certificate(c.info.ssl); peer != nullptr) {
      char name[256] = {};
      if (SSL_get_verify_result(c.info.ssl) == X509_V_OK &&
          X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, name,
                                    sizeof(name)) > 0) {
        common_name = name;
      }
      X509_free(peer);
    }
    spdlog::debug("listener: connection {} from {}: TLS handshake done ({})", c.info.id,
                  c.info.peer, common_name.empty() ? "no client certificate" : common_name);
    owner_.Handshaken(c.info, common_name);
  }
  ERR_clear_error();
  const int n = SSL_read(c.info.ssl, buffer, static_cast<int>(size));
  if (n > 0) return n;
  const int error = SSL_get_error(c.info.ssl, n);
  if (error == SSL_ERROR_WANT_READ) return -1;
  if (error == SSL_ERROR_WANT_WRITE) {
    c.tls_wants_write = true;
    return -1;
  }
  ERR_clear_error();
  return 0;
}

void RelayLoop::ReadClient(Connection& c) {
  absl::Cleanup report = [&] { ReportCounters(c); };
  char buffer[kReadChunk];
  // Under TLS, OpenSSL may hold decrypted bytes the socket no longer signals: read until it
  // has none, or until gRPC's side holds enough.
  do {
    const ssize_t n = ReceiveFromClient(c, buffer, sizeof(buffer));
    if (n < 0) return;
    if (n == 0) {
      // The client is gone: so is everything gRPC still had to say to it.
      close(c.info.client_fd);
      c.info.client_fd = -1;
      return;
    }
    if (c.draining) continue;  // the guard ended it: nothing more goes to gRPC
    if (std::optional<GuardClose> closed = c.guard.FromClient(
            std::string_view(buffer, static_cast<size_t>(n)), absl::Now(), c.out)) {
      c.closed_by = closed;
      CloseGrpcSide(c);  // gRPC cancels the connection's calls
    }
  } while (c.info.ssl != nullptr && SSL_pending(c.info.ssl) > 0 &&
           c.PendingToServer() <= max_buffered_bytes_);
}

bool RelayLoop::SendToClient(Connection& c) {
  if (c.info.ssl == nullptr)
    return WritePending(c.info.client_fd, c.out.to_client, c.to_client_sent);
  if (!c.handshaken) return true;
  while (c.PendingToClient() > 0) {
    ERR_clear_error();
    const int n = SSL_write(c.info.ssl, c.out.to_client.data() + c.to_client_sent,
                            static_cast<int>(std::min<size_t>(c.PendingToClient(), 1 << 20)));
    if (n > 0) {
      c.to_client_sent += static_cast<size_t>(n);
      continue;
    }
    const int error = SSL_get_error(c.info.ssl, n);
    if (error == SSL_ERROR_WANT_WRITE) {
      c.tls_wants_write = true;
      break;
    }
    if (error == SSL_ERROR_WANT_READ) break;
    ERR_clear_error();
    return false;
  }
  Compact(c.out.to_client, c.to_client_sent);
  return true;
}

void RelayLoop::ReportCounters(Connection& c) {
  const Http2Guard::Counters& now = c.guard.counters();
  const Http2Guard::Counters added{now.streams - c.reported.streams, now.resets - c.reported.resets,
                                   now.refused_messages - c.reported.refused_messages};
  if (added.streams == 0 && added.resets == 0 && added.refused_messages == 0) return;
  owner_.Counted(added);
  c.reported = now;
}

void RelayLoop::ReadGrpc(Connection& c) {
  char buffer[kReadChunk];
  const ssize_t n = read(c.info.grpc_fd, buffer, sizeof(buffer));
  if (n > 0) {
    c.guard.FromServer(std::string_view(buffer, static_cast<size_t>(n)), c.out);
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  spdlog::debug("listener: gRPC ended connection {} from {}: {}", c.info.id, c.info.peer,
                n == 0 ? "end of stream" : std::strerror(errno));
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
    ++timed_;
    c.drain_deadline = absl::Now() + kDrainGrace;
  }
}

void RelayLoop::Flush(Connection& c) {
  if (c.info.grpc_fd >= 0 && !WritePending(c.info.grpc_fd, c.out.to_server, c.to_server_sent)) {
    CloseGrpcSide(c);
  }
  if (!SendToClient(c) || (c.draining && c.PendingToClient() == 0)) {
    Finish(c.info.id);
    return;
  }
  // Decrypted bytes OpenSSL held back while gRPC's side was full.
  if (c.info.ssl != nullptr && c.handshaken && !c.draining && SSL_pending(c.info.ssl) > 0 &&
      c.PendingToServer() <= max_buffered_bytes_) {
    ReadClient(c);
    if (c.info.client_fd < 0) {
      Finish(c.info.id);
      return;
    }
    if (c.info.grpc_fd >= 0 && !WritePending(c.info.grpc_fd, c.out.to_server, c.to_server_sent)) {
      CloseGrpcSide(c);
    }
  }
  Watch(c);
}

void RelayLoop::Watch(Connection& c) {
  uint32_t client = 0;
  if (!c.draining && c.PendingToServer() <= max_buffered_bytes_) client |= EPOLLIN;
  if (c.draining) client |= EPOLLIN;  // read and dropped, so a closing client is seen
  if (c.PendingToClient() > 0 || c.tls_wants_write) client |= EPOLLOUT;
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
  if (c.info.ssl != nullptr) {
    ERR_clear_error();
    if (c.handshaken && c.info.client_fd >= 0) SSL_shutdown(c.info.ssl);  // close_notify
    SSL_free(c.info.ssl);
    ERR_clear_error();
  }
  if (c.info.client_fd >= 0) close(c.info.client_fd);
  if (c.info.grpc_fd >= 0) close(c.info.grpc_fd);
  if (c.draining) --timed_;
  if (!c.handshaken) --timed_;
  spdlog::debug("listener: connection {} from {} ends ({}{}{}{})", c.info.id, c.info.peer,
                c.info.client_fd < 0 ? "the client closed it" : "closed here",
                c.handshaken ? "" : ", before its TLS handshake finished",
                c.info.grpc_fd < 0 ? ", gRPC's side closed" : "",
                c.closed_by ? absl::StrCat(", the guard: ", GuardCloseName(*c.closed_by)) : "");
  ReportCounters(c);
  owner_.Closed(c.info, c.closed_by, c.guard);
  connections_.erase(it);
}

}  // namespace mlaserve::listener
