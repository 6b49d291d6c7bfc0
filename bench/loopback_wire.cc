#include "bench/loopback_wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/host_port.h"

namespace mlaserve::bench {
namespace {

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat("loopback wire: ", what, ": ", std::strerror(errno)));
}

bool SendAll(int fd, const char* data, int64_t bytes) {
  while (bytes > 0) {
    const ssize_t n = send(fd, data, static_cast<size_t>(bytes), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data += n;
    bytes -= n;
  }
  return true;
}

bool ReceiveAll(int fd, char* data, int64_t bytes) {
  while (bytes > 0) {
    const ssize_t n = recv(fd, data, static_cast<size_t>(bytes), 0);
    if (n <= 0) return false;
    data += n;
    bytes -= n;
  }
  return true;
}

void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The client's side: `calls` round trips (after one to warm up) on a connected socket.
absl::StatusOr<loadgen::Percentiles> RoundTrips(int client, const WireProbe& probe) {
  const std::vector<char> request(static_cast<size_t>(probe.request_bytes), 2);
  std::vector<char> response(static_cast<size_t>(probe.response_bytes));
  std::vector<double> times_us;
  for (int call = 0; call < probe.calls + 1; ++call) {
    absl::SleepFor(probe.idle_between);
    const absl::Time start = absl::Now();
    if (!SendAll(client, request.data(), probe.request_bytes) ||
        !ReceiveAll(client, response.data(), probe.response_bytes)) {
      return Errno("round trip");
    }
    if (call > 0) times_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  return loadgen::PercentilesOf(std::move(times_us));
}

absl::StatusOr<sockaddr_in> Ipv4(const std::string& address, const char* flag) {
  absl::StatusOr<HostPort> where = ParseHostPort(address, flag);
  if (!where.ok()) return where.status();
  sockaddr_in in = {};
  in.sin_family = AF_INET;
  in.sin_port = htons(static_cast<uint16_t>(where->port));
  if (inet_pton(AF_INET, where->host.c_str(), &in.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", where->host, "' is not an IPv4 address"));
  }
  return in;
}

}  // namespace

WireProbe CallWireBytes(const engine::ModelConfig& m, const loadgen::WorkloadOptions& w) {
  const int64_t rows = int64_t{w.sq} * m.heads;
  const int64_t q_values = rows * (w.head_space ? m.dn + m.dr : m.dl + m.dr);
  const int64_t out_values = rows * (w.head_space ? m.dv : m.dl);
  return {.request_bytes = w.sequences * (q_values + m.dl + m.dr) * 2,
          .response_bytes = w.sequences * (out_values * 2 + rows * 4)};
}

absl::Status ServeWireEcho(const std::string& listen_address, int64_t request_bytes,
                           int64_t response_bytes) {
  absl::StatusOr<sockaddr_in> address = Ipv4(listen_address, "--wire_listen");
  if (!address.ok()) return address.status();
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return Errno("socket");
  absl::Cleanup close_listener = [listener] { close(listener); };
  const int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listener, reinterpret_cast<sockaddr*>(&*address), sizeof(*address)) != 0) {
    return Errno("bind");
  }
  if (listen(listener, 4) != 0) return Errno("listen");
  std::vector<char> request(static_cast<size_t>(request_bytes));
  const std::vector<char> response(static_cast<size_t>(response_bytes), 1);
  for (;;) {
    const int server = accept(listener, nullptr, nullptr);
    if (server < 0) return Errno("accept");
    NoDelay(server);
    while (ReceiveAll(server, request.data(), request_bytes) &&
           SendAll(server, response.data(), response_bytes)) {
    }
    close(server);
  }
}

absl::StatusOr<loadgen::Percentiles> MeasureRoundTripTo(const std::string& far_end,
                                                        const WireProbe& probe) {
  absl::StatusOr<sockaddr_in> address = Ipv4(far_end, "--wire_echo");
  if (!address.ok()) return address.status();
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  if (client < 0) return Errno("socket");
  absl::Cleanup close_client = [client] { close(client); };
  if (connect(client, reinterpret_cast<sockaddr*>(&*address), sizeof(*address)) != 0) {
    return Errno("connect");
  }
  NoDelay(client);
  return RoundTrips(client, probe);
}

absl::StatusOr<loadgen::Percentiles> MeasureLoopbackRoundTrip(const WireProbe& probe) {
  if (probe.calls < 1 || probe.request_bytes < 1 || probe.response_bytes < 1) {
    return absl::InvalidArgumentError("loopback wire: calls and byte counts must be positive");
  }
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return Errno("socket");
  absl::Cleanup close_listener = [listener] { close(listener); };
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0) return Errno("bind");
  if (listen(listener, 1) != 0) return Errno("listen");
  if (getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return Errno("getsockname");
  }
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  if (client < 0) return Errno("socket");
  absl::Cleanup close_client = [client] { close(client); };
  if (connect(client, reinterpret_cast<sockaddr*>(&address), length) != 0) return Errno("connect");
  const int server = accept(listener, nullptr, nullptr);
  if (server < 0) return Errno("accept");
  NoDelay(client);
  NoDelay(server);

  // The far end answers every request in full with the response's bytes, until the client
  // closes its side.
  std::thread far_end([server, &probe] {
    std::vector<char> request(static_cast<size_t>(probe.request_bytes));
    const std::vector<char> response(static_cast<size_t>(probe.response_bytes), 1);
    while (ReceiveAll(server, request.data(), probe.request_bytes) &&
           SendAll(server, response.data(), probe.response_bytes)) {
    }
    close(server);
  });
  const std::vector<char> request(static_cast<size_t>(probe.request_bytes), 2);
  std::vector<char> response(static_cast<size_t>(probe.response_bytes));
  std::vector<double> times_us;
  bool ok = true;
  for (int call = 0; ok && call < probe.calls + 1; ++call) {  // the first call warms up
    absl::SleepFor(probe.idle_between);
    const absl::Time start = absl::Now();
    ok = SendAll(client, request.data(), probe.request_bytes) &&
         ReceiveAll(client, response.data(), probe.response_bytes);
    if (call > 0) times_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  shutdown(client, SHUT_WR);
  far_end.join();
  if (!ok) return Errno("round trip");
  return loadgen::PercentilesOf(std::move(times_us));
}

}  // namespace mlaserve::bench
