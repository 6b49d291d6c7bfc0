#ifndef MLASERVE_SERVER_LISTENER_GUARDED_LISTENER_H_
#define MLASERVE_SERVER_LISTENER_GUARDED_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server.h"
#include "server/listener/http2_guard_limits.h"
#include "server/listener/relay_loop.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace mlaserve::listener {

struct GuardedListenerOptions {
  std::string address;  // host:port (port 0: any free), as --listen takes it
  Http2GuardLimits limits;
  int relay_threads = 1;
  // Bytes a connection may hold in each direction before the relay stops reading the side
  // that sends them.
  size_t max_buffered_bytes = size_t{4} << 20;
  // TLS on the port, terminated by the relay: called once on the listener's SSL_CTX to set
  // its certificates and client verification (false: it could not); the listener adds
  // ALPN "h2" and TLS 1.2 at least. Unset: plaintext.
  std::function<bool(SSL_CTX*)> configure_tls;
  // A client that has not finished its TLS handshake by then is closed.
  absl::Duration handshake_timeout = absl::Seconds(10);
  // After the guard ends a client's connection for resets or streams, the client's new
  // connections are closed at accept for this long: a flood that reconnects costs an accept,
  // not a TLS handshake and a gRPC transport each time.
  absl::Duration cooldown = absl::Seconds(1);
};

// The server's listening socket, owned by mlaserve instead of gRPC, so that every connection
// passes an Http2Guard (docs/deploy.md, "HTTP/2 guard"): accepted sockets are relayed to gRPC
// through a socket pair (grpc::AddInsecureChannelFromFd), which serves them as it serves its
// own. gRPC then names a call's peer "fd:N"; PeerOf gives back the client's address.
class GuardedListener : public ConnectionOwner {
 public:
  struct Stats {
    int64_t connections_accepted = 0;
    int64_t connections_open = 0;
    int64_t streams = 0;            // streams clients opened, open connections' included
    int64_t resets = 0;             // RST_STREAM frames clients sent (same)
    int64_t refused_messages = 0;   // messages refused by their declared length
    int64_t closed_for_resets = 0;  // connections ended with GOAWAY, by reason
    int64_t closed_for_streams = 0;
    int64_t closed_for_protocol = 0;
    // Connections closed at accept: their client's last one was ended for resets or streams
    // within the cooldown.
    int64_t refused_connections = 0;
  };

  // Binds `options.address` and starts accepting for `server` (built with no listening port
  // of its own). UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<GuardedListener>> Start(grpc::Server& server,
                                                                GuardedListenerOptions options);
  ~GuardedListener() override;  // stops accepting, closes every connection

  int port() const { return port_; }
  // New connections are refused from now on; open ones keep being relayed (a drain).
  void StopAccepting();
  // The client address of a call whose gRPC peer is `grpc_peer` ("fd:N" for the listener's
  // connections); `grpc_peer` itself for anything else.
  std::string PeerOf(const std::string& grpc_peer) const;
  // The verified client certificate's common name of a call's connection (TLS with client
  // certificates), or nothing.
  std::optional<std::string> CommonNameOf(const std::string& grpc_peer) const;
  Stats stats() const;

  void Closed(const AcceptedConnection& connection, std::optional<GuardClose> closed_by,
              const Http2Guard& guard) override;
  void Handshaken(const AcceptedConnection& connection, const std::string& common_name) override;
  void Counted(const Http2Guard::Counters& added) override;

 private:
  explicit GuardedListener(grpc::Server& server, GuardedListenerOptions options);
  void AcceptLoop();
  void Accept(int client_fd, const std::string& peer, const std::string& client);
  std::shared_ptr<ClientRates> RatesOf(const std::string& client);

  grpc::Server& server_;
  const GuardedListenerOptions options_;
  SSL_CTX* tls_ = nullptr;  // owned; null: plaintext
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::vector<std::unique_ptr<RelayLoop>> loops_;
  uint64_t next_id_ = 1;  // acceptor thread only

  mutable absl::Mutex mu_;
  struct Peer {
    uint64_t connection = 0;
    std::string address;
    std::string common_name;  // verified, under TLS with client certificates
  };
  absl::flat_hash_map<int, Peer> peers_ ABSL_GUARDED_BY(mu_);  // by gRPC's descriptor
  struct Client {
    std::shared_ptr<ClientRates> rates;
    int connections = 0;
  };
  absl::flat_hash_map<std::string, Client> clients_ ABSL_GUARDED_BY(mu_);
  // Clients whose connection the guard ended for resets or streams, until when their new
  // connections are closed at accept (bounded).
  absl::flat_hash_map<std::string, absl::Time> cooling_ ABSL_GUARDED_BY(mu_);
  // Clients whose connection the guard ended, logged once each (bounded).
  absl::flat_hash_set<std::string> logged_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Added by the relay loops as bytes are read: atomics, not mu_, on that path.
  std::atomic<int64_t> streams_{0};
  std::atomic<int64_t> resets_{0};
  std::atomic<int64_t> refused_messages_{0};
};

}  // namespace mlaserve::listener

#endif  // MLASERVE_SERVER_LISTENER_GUARDED_LISTENER_H_
