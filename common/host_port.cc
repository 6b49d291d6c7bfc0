#include "common/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mlaserve {

absl::StatusOr<HostPort> ParseHostPort(const std::string& text, const std::string& flag) {
  const auto malformed = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", text, "' is not host:port or [v6]:port (", why, ")"));
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return malformed("no host");
  HostPort parsed;
  parsed.host = text.substr(0, colon);
  if (parsed.host.front() == '[') {
    if (parsed.host.size() < 3 || parsed.host.back() != ']') return malformed("unclosed [");
    parsed.host = parsed.host.substr(1, parsed.host.size() - 2);
  } else if (parsed.host.find(':') != std::string::npos) {
    return malformed("an IPv6 host needs brackets");
  }
  if (!absl::SimpleAtoi(text.substr(colon + 1), &parsed.port) || parsed.port < 0 ||
      parsed.port > 65535) {
    return malformed("port not in 0..65535");
  }
  return parsed;
}

}  // namespace mlaserve
