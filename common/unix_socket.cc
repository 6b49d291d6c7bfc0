#include "common/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mlaserve {
namespace {

absl::StatusOr<std::pair<sockaddr_un, socklen_t>> Address(const std::string& address) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (address.empty() || address.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket address '", address, "': 1 to ",
                                                   sizeof(addr.sun_path) - 1, " characters"));
  }
  std::memcpy(addr.sun_path, address.data(), address.size());
  if (address[0] == '@') addr.sun_path[0] = '\0';  // abstract: no terminating NUL counted
  return std::make_pair(addr,
                        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size()));
}

absl::Status Errno(absl::string_view what, const std::string& address) {
  return absl::UnavailableError(
      absl::StrCat(what, " unix socket ", address, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<int> ListenUnix(const std::string& address) {
  absl::StatusOr<std::pair<sockaddr_un, socklen_t>> addr = Address(address);
  if (!addr.ok()) return addr.status();
  if (address[0] != '@') {
    struct stat st {};
    if (lstat(address.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return absl::UnavailableError(
            absl::StrCat("unix socket ", address, ": a file that is not a socket is there"));
      }
      unlink(address.c_str());  // a stale socket of an earlier start
    }
  }
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno("create", address);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0 ||
      listen(fd, 128) != 0) {
    absl::Status status = Errno("bind", address);
    close(fd);
    return status;
  }
  if (address[0] != '@') chmod(address.c_str(), 0666);  // who may connect: tickets decide
  return fd;
}

absl::StatusOr<int> ConnectUnix(const std::string& address) {
  absl::StatusOr<std::pair<sockaddr_un, socklen_t>> addr = Address(address);
  if (!addr.ok()) return addr.status();
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("create", address);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0) {
    absl::Status status = Errno("connect to", address);
    close(fd);
    return status;
  }
  return fd;
}

bool SendUnixMessage(int fd, absl::string_view bytes, int pass_fd) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (pass_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &pass_fd, sizeof(int));
  }
  ssize_t sent;
  do {
    sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  return sent == static_cast<ssize_t>(bytes.size());
}

UnixReceive ReceiveUnixMessage(int fd, size_t max_bytes) {
  UnixReceive received;
  std::string bytes(max_bytes, '\0');
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t got;
  do {
    got = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    received.would_block = true;
    return received;
  }
  if (got <= 0) return received;
  UnixMessage message;
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int passed;
      std::memcpy(&passed, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      // One descriptor is kept; any more a client sends are closed, not leaked.
      if (message.fd < 0) {
        message.fd = passed;
      } else {
        close(passed);
      }
    }
  }
  bytes.resize(static_cast<size_t>(got));
  message.bytes = std::move(bytes);
  received.message = std::move(message);
  return received;
}

PeerCredentials PeerOf(int fd) {
  ucred cred{};
  socklen_t length = sizeof(cred);
  PeerCredentials peer;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
  }
  return peer;
}

}  // namespace mlaserve
