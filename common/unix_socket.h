#ifndef MLASERVE_COMMON_UNIX_SOCKET_H_
#define MLASERVE_COMMON_UNIX_SOCKET_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlaserve {

// Unix-domain SOCK_SEQPACKET sockets (message boundaries kept, file descriptors passed with
// SCM_RIGHTS): the same-host data plane's control socket. An address is a path, or "@name"
// for a Linux abstract socket (no file to remove, scoped to the network namespace).

// A non-blocking listening socket. A stale socket file at the path is replaced; anything
// else there is refused (UNAVAILABLE naming the path).
absl::StatusOr<int> ListenUnix(const std::string& address);
// A blocking connection.
absl::StatusOr<int> ConnectUnix(const std::string& address);

// One message, with `pass_fd` attached when >= 0. False if the peer is gone.
bool SendUnixMessage(int fd, absl::string_view bytes, int pass_fd = -1);

struct UnixMessage {
  std::string bytes;
  int fd = -1;  // a passed descriptor, owned by the caller (close it)
};
// The next message (at most `max_bytes`; a longer one is cut). nullopt when the peer closed
// or on an error; for a non-blocking socket with nothing to read, an empty message with
// `would_block` set.
struct UnixReceive {
  std::optional<UnixMessage> message;
  bool would_block = false;
};
UnixReceive ReceiveUnixMessage(int fd, size_t max_bytes);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
};
PeerCredentials PeerOf(int fd);

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_UNIX_SOCKET_H_
