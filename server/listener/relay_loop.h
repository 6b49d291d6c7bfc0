#ifndef MLASERVE_SERVER_LISTENER_RELAY_LOOP_H_
#define MLASERVE_SERVER_LISTENER_RELAY_LOOP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/listener/client_rates.h"
#include "server/listener/http2_guard.h"

typedef struct ssl_st SSL;

namespace mlaserve::listener {

// A connection the listener accepted: the client's socket and the relay's end of the socket
// pair whose other end gRPC serves.
struct AcceptedConnection {
  uint64_t id = 0;
  int client_fd = -1;
  int grpc_fd = -1;
  int grpc_served_fd = -1;  // gRPC's end, which gRPC owns: the N of its peer name "fd:N"
  std::string peer;         // as gRPC names peers: "ipv4:127.0.0.1:40312"
  std::string client;       // the address without its port: whose rates it shares
  std::shared_ptr<ClientRates> rates;
  SSL* ssl = nullptr;  // TLS on the client's side (the loop owns it); null: plaintext
};

// What a relay loop tells its listener. Called on the loop's thread.
class ConnectionOwner {
 public:
  virtual ~ConnectionOwner() = default;
  // A connection ended: `closed_by` is set when the guard ended it.
  virtual void Closed(const AcceptedConnection& connection, std::optional<GuardClose> closed_by,
                      const Http2Guard& guard) = 0;
  // A TLS handshake finished, before any of the connection's bytes reach gRPC: the client
  // certificate's common name when one was presented and verified, else empty.
  virtual void Handshaken(const AcceptedConnection& connection, const std::string& common_name) = 0;
  // What the connection's guard counted since the last call (streams opened, resets, refused
  // messages), reported as the client's bytes are read, so that totals include connections
  // still open: a framework's channel lives for weeks. All of it before Closed.
  virtual void Counted(const Http2Guard::Counters& added) = 0;
};

// One thread moving bytes both ways between clients and gRPC through each connection's
// Http2Guard (epoll, level-triggered, non-blocking sockets). A direction stops being read while
// more than `max_buffered_bytes` wait to be written the other way, so a peer that does not
// read holds back its counterpart instead of the relay's memory.
class RelayLoop {
 public:
  RelayLoop(const Http2GuardLimits& limits, size_t max_buffered_bytes,
            absl::Duration handshake_timeout, ConnectionOwner& owner);
  ~RelayLoop();  // stops the thread and closes every connection
  RelayLoop(const RelayLoop&) = delete;
  RelayLoop& operator=(const RelayLoop&) = delete;

  absl::Status Start();
  // Hands a connection to the loop (thread-safe); the loop owns its descriptors from now on.
  void Add(AcceptedConnection connection);

 private:
  struct Connection;
  void Run();
  void TakeNew();
  void ReadClient(Connection& c);
  // Hands the owner what the guard counted since the last report.
  void ReportCounters(Connection& c);
  // The client's bytes, decrypted under TLS: > 0 bytes, 0 when the client is gone, -1 when
  // nothing is there yet.
  ssize_t ReceiveFromClient(Connection& c, char* buffer, size_t size);
  bool SendToClient(Connection& c);
  void ReadGrpc(Connection& c);
  void Flush(Connection& c);
  void Watch(Connection& c);
  void CloseGrpcSide(Connection& c);
  void Finish(uint64_t id);

  const Http2GuardLimits limits_;
  const size_t max_buffered_bytes_;
  const absl::Duration handshake_timeout_;
  ConnectionOwner& owner_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  bool stopping_ = false;  // set under mu_, read by the loop after a wake
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<AcceptedConnection> incoming_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Connection>> connections_;
  int timed_ = 0;  // connections among them that are draining or handshaking
};

}  // namespace mlaserve::listener

#endif  // MLASERVE_SERVER_LISTENER_RELAY_LOOP_H_
