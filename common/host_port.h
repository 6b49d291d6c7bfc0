#ifndef MLASERVE_COMMON_HOST_PORT_H_
#define MLASERVE_COMMON_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"

namespace mlaserve {

struct HostPort {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without its brackets
  int port = 0;      // 0..65535; 0 asks a listener for any free port
};

// Parses "host:port" or "[v6]:port", the address form of every --listen-style flag.
// INVALID_ARGUMENT naming `flag` when the text is not of that form or the port is out of range.
absl::StatusOr<HostPort> ParseHostPort(const std::string& text, const std::string& flag);

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_HOST_PORT_H_
