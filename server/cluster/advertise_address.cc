#include "server/cluster/advertise_address.h"

#include <unistd.h>

#include <array>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"

namespace mlaserve::cluster {

absl::StatusOr<std::string> AdvertiseAddress(const std::string& advertised,
                                             const std::string& listen, int port) {
  if (!advertised.empty()) return advertised;
  absl::StatusOr<HostPort> parsed = ParseHostPort(listen, "listen");
  if (!parsed.ok()) return parsed.status();
  std::string host = parsed->host;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    std::array<char, 256> name{};
    if (::gethostname(name.data(), name.size() - 1) != 0 || name[0] == '\0') {
      return absl::FailedPreconditionError(
          "advertise_address: --listen is a wildcard address and the host name is unknown; "
          "set --advertise_address");
    }
    host = name.data();
  }
  const bool v6 = host.find(':') != std::string::npos;
  return v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

}  // namespace mlaserve::cluster
