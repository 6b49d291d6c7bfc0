#include "server/listener/guarded_listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/host_port.h"
#include "grpcpp/server_posix.h"
#include "openssl/ssl.h"
#include "spdlog/spdlog.h"

namespace mlaserve::listener {
namespace {

constexpr size_t kLoggedClients = 4096;

// gRPC speaks HTTP/2 only: a client that does not offer "h2" is refused in the handshake.
int SelectH2(SSL*, const unsigned char** out, unsigned char* out_length, const unsigned char* in,
             unsigned int in_length, void*) {
  static constexpr unsigned char kH2[] = {2, 'h', '2'};
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, out_length, kH2, sizeof(kH2), in, in_length) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

// The client's address as gRPC writes peers, and the address alone (whose rates it shares).
std::pair<std::string, std::string> DescribePeer(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    return {absl::StrCat("ipv6:[", host, "]:", ntohs(v6->sin6_port)), host};
  }
  const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
  inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
  return {absl::StrCat("ipv4:", host, ":", ntohs(v4->sin_port)), host};
}

// gRPC's name for a peer it serves over a descriptor handed to it: "fd:N".
std::optional<int> DescriptorOf(const std::string& grpc_peer) {
  int fd = 0;
  if (!absl::StartsWith(grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer.substr(3), &fd)) {
    return std::nullopt;
  }
  return fd;
}

absl::StatusOr<int> Bind(const std::string& text, int& port) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(text, "listen");
  if (!parsed.ok()) return parsed.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(parsed->port);
  const int resolved = getaddrinfo(parsed->host.empty() ? nullptr : parsed->host.c_str(),
                                   service.c_str(), &hints, &found);
  if (resolved != 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot resolve ", text, ": ", gai_strerror(resolved)));
  }
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    const int zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // restarts, not sharing
    if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", text, ": ", error));
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

}  // namespace

GuardedListener::GuardedListener(grpc::Server& server, GuardedListenerOptions options)
    : server_(server), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<GuardedListener>> GuardedListener::Start(
    grpc::Server& server, GuardedListenerOptions options) {
  std::unique_ptr<GuardedListener> listener(new GuardedListener(server, std::move(options)));
  absl::StatusOr<int> fd = Bind(listener->options_.address, listener->port_);
  if (!fd.ok()) return fd.status();
  listener->listen_fd_ = *fd;
  if (listener->options_.configure_tls) {
    listener->tls_ = SSL_CTX_new(TLS_server_method());
    if (listener->tls_ == nullptr) return absl::InternalError("cannot create an OpenSSL context");
    SSL_CTX_set_min_proto_version(listener->tls_, TLS1_2_VERSION);
    SSL_CTX_set_mode(listener->tls_,
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_alpn_select_cb(listener->tls_, &SelectH2, nullptr);
    if (!listener->options_.configure_tls(listener->tls_)) {
      return absl::InvalidArgumentError("the TLS certificates could not be set up");
    }
  }
  listener->stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (listener->stop_fd_ < 0) return absl::InternalError(std::strerror(errno));
  for (int i = 0; i < std::max(1, listener->options_.relay_threads); ++i) {
    auto loop = std::make_unique<RelayLoop>(listener->options_.limits,
                                            listener->options_.max_buffered_bytes,
                                            listener->options_.handshake_timeout, *listener);
    if (absl::Status started = loop->Start(); !started.ok()) return started;
    listener->loops_.push_back(std::move(loop));
  }
  GuardedListener* self = listener.get();
  listener->acceptor_ = std::thread([self] { self->AcceptLoop(); });
  return listener;
}

GuardedListener::~GuardedListener() {
  StopAccepting();
  loops_.clear();  // closes every connection (Closed() runs for each)
  if (stop_fd_ >= 0) close(stop_fd_);
  if (tls_ != nullptr) SSL_CTX_free(tls_);
}

void GuardedListener::StopAccepting() {
  if (acceptor_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    acceptor_.join();
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
  }
}

void GuardedListener::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("listener: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        // Out of descriptors, most likely: back off instead of spinning.
        spdlog::warn("listener: accept: {}", std::strerror(errno));
        poll(nullptr, 0, 100);
      }
      continue;
    }
    const auto [peer, client] = DescribePeer(address);
    Accept(fd, peer, client);
  }
}

void GuardedListener::Accept(int client_fd, const std::string& peer, const std::string& client) {
  {
    absl::MutexLock lock(&mu_);
    auto cooling = cooling_.find(client);
    if (cooling != cooling_.end()) {
      if (absl::Now() < cooling->second) {
        ++stats_.refused_connections;
        close(client_fd);
        return;
      }
      cooling_.erase(cooling);
    }
  }
  const int one = 1;
  setsockopt(client_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // as gRPC's own
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
    spdlog::warn("listener: socketpair: {}", std::strerror(errno));
    close(client_fd);
    return;
  }
  AcceptedConnection connection;
  connection.id = next_id_++;
  connection.client_fd = client_fd;
  connection.grpc_fd = pair[0];
  connection.grpc_served_fd = pair[1];
  connection.peer = peer;
  connection.client = client;
  connection.rates = RatesOf(client);
  if (tls_ != nullptr) {
    connection.ssl = SSL_new(tls_);
    if (connection.ssl == nullptr || SSL_set_fd(connection.ssl, client_fd) != 1) {
      spdlog::warn("listener: cannot set up TLS for a connection from {}", peer);
      if (connection.ssl != nullptr) SSL_free(connection.ssl);
      close(client_fd);
      close(pair[0]);
      close(pair[1]);
      absl::MutexLock lock(&mu_);
      auto entry = clients_.find(client);
      if (entry != clients_.end() && --entry->second.connections == 0) clients_.erase(entry);
      return;
    }
    SSL_set_accept_state(connection.ssl);
  }
  {
    absl::MutexLock lock(&mu_);
    peers_[pair[1]] = Peer{connection.id, peer, ""};
    ++stats_.connections_accepted;
    ++stats_.connections_open;
  }
  spdlog::debug("listener: connection {} from {} accepted", connection.id, peer);
  RelayLoop& loop = *loops_[connection.id % loops_.size()];
  loop.Add(std::move(connection));
  grpc::AddInsecureChannelFromFd(&server_, pair[1]);  // gRPC owns pair[1] from here
}

std::shared_ptr<ClientRates> GuardedListener::RatesOf(const std::string& client) {
  absl::MutexLock lock(&mu_);
  Client& entry = clients_[client];
  if (entry.rates == nullptr) {
    entry.rates = std::make_shared<ClientRates>(options_.limits, absl::Now());
  }
  ++entry.connections;
  return entry.rates;
}

void GuardedListener::Closed(const AcceptedConnection& connection,
                             std::optional<GuardClose> closed_by, const Http2Guard& guard) {
  bool log = false;
  {
    absl::MutexLock lock(&mu_);
    --stats_.connections_open;
    // gRPC may have closed its descriptor and a newer connection taken the number already.
    auto peer = peers_.find(connection.grpc_served_fd);
    if (peer != peers_.end() && peer->second.connection == connection.id) peers_.erase(peer);
    auto client = clients_.find(connection.client);
    if (client != clients_.end() && --client->second.connections == 0) clients_.erase(client);
    if (closed_by.has_value()) {
      switch (*closed_by) {
        case GuardClose::kResets:
          ++stats_.closed_for_resets;
          break;
        case GuardClose::kStreams:
          ++stats_.closed_for_streams;
          break;
        case GuardClose::kProtocol:
          ++stats_.closed_for_protocol;
          break;
      }
      if (*closed_by != GuardClose::kProtocol && options_.cooldown > absl::ZeroDuration()) {
        if (cooling_.size() >= kLoggedClients) cooling_.clear();
        cooling_[connection.client] = absl::Now() + options_.cooldown;
      }
      if (logged_.size() >= kLoggedClients) logged_.clear();
      log = logged_.insert(connection.client).second;
    }
  }
  if (log) {
    spdlog::warn(
        "HTTP/2 guard: connection from {} ended with GOAWAY ({}{}{}; {} streams opened, {} "
        "resets); logged once per client, counted in mlaserve_http2_guard_goaways_total",
        connection.peer, GuardCloseName(*closed_by), guard.last_refusal().empty() ? "" : ": ",
        guard.last_refusal(), guard.counters().streams, guard.counters().resets);
  }
}

void GuardedListener::Handshaken(const AcceptedConnection& connection,
                                 const std::string& common_name) {
  if (common_name.empty()) return;
  absl::MutexLock lock(&mu_);
  auto peer = peers_.find(connection.grpc_served_fd);
  if (peer != peers_.end() && peer->second.connection == connection.id) {
    peer->second.common_name = common_name;
  }
}

std::optional<std::string> GuardedListener::CommonNameOf(const std::string& grpc_peer) const {
  const std::optional<int> fd = DescriptorOf(grpc_peer);
  if (!fd.has_value()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(*fd);
  if (it == peers_.end() || it->second.common_name.empty()) return std::nullopt;
  return it->second.common_name;
}

std::string GuardedListener::PeerOf(const std::string& grpc_peer) const {
  const std::optional<int> fd = DescriptorOf(grpc_peer);
  if (!fd.has_value()) return grpc_peer;
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(*fd);
  return it == peers_.end() ? grpc_peer : it->second.address;
}

void GuardedListener::Counted(const Http2Guard::Counters& added) {
  streams_.fetch_add(added.streams, std::memory_order_relaxed);
  resets_.fetch_add(added.resets, std::memory_order_relaxed);
  refused_messages_.fetch_add(added.refused_messages, std::memory_order_relaxed);
}

GuardedListener::Stats GuardedListener::stats() const {
  Stats stats;
  {
    absl::MutexLock lock(&mu_);
    stats = stats_;
  }
  stats.streams = streams_.load(std::memory_order_relaxed);
  stats.resets = resets_.load(std::memory_order_relaxed);
  stats.refused_messages = refused_messages_.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace mlaserve::listener
