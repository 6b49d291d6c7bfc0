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

}  // namespace

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
