#include "client/loadgen/http_get.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mlaserve::loadgen {
namespace {

// Closes the descriptor on every path out.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

absl::Status SplitHostPort(const std::string& host_port, std::string& host, std::string& port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size()) {
    return absl::InvalidArgumentError(absl::StrCat("'", host_port, "' is not host:port"));
  }
  host = host_port.substr(0, colon);
  port = host_port.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout) {
  std::string host, port;
  if (absl::Status s = SplitHostPort(host_port, host, port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", host_port, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  std::string answer;
  bool answered = false;
  for (const addrinfo* a = found; a != nullptr && !answered; a = a->ai_next) {
    Socket socket_fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (socket_fd.fd() < 0) {
      error = std::strerror(errno);
      continue;
    }
    // One timeout for connect (SO_SNDTIMEO bounds it on Linux) and for each read.
    const timeval tv = absl::ToTimeval(timeout);
    setsockopt(socket_fd.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(socket_fd.fd(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(socket_fd.fd(), a->ai_addr, a->ai_addrlen) != 0) {
      error = std::strerror(errno);
      continue;
    }
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
    if (send(socket_fd.fd(), request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      error = std::strerror(errno);
      continue;
    }
    char buffer[16384];
    ssize_t n = 0;
    while ((n = recv(socket_fd.fd(), buffer, sizeof(buffer), 0)) > 0) answer.append(buffer, n);
    if (n < 0) {
      error = absl::StrCat("reading the answer: ", std::strerror(errno));
      answer.clear();
      continue;
    }
    answered = true;
  }
  freeaddrinfo(found);
  if (!answered) {
    return absl::UnavailableError(absl::StrCat("GET ", host_port, path, ": ", error));
  }
  const size_t headers_end = answer.find("\r\n\r\n");
  if (headers_end == std::string::npos) {
    return absl::InternalError(absl::StrCat("GET ", host_port, path, ": no HTTP headers"));
  }
  absl::string_view status_line(answer.data(), answer.find("\r\n"));
  // "HTTP/1.0 200 OK" or "HTTP/1.1 200 OK": the code is the second word.
  const size_t space = status_line.find(' ');
  if (space == absl::string_view::npos || !absl::StartsWith(status_line.substr(space + 1), "200")) {
    return absl::InternalError(absl::StrCat("GET ", host_port, path, ": ", status_line));
  }
  return answer.substr(headers_end + 4);
}

}  // namespace mlaserve::loadgen
