#ifndef MLASERVE_TESTS_INTEGRATION_DATA_PLANE_SERVER_H_
#define MLASERVE_TESTS_INTEGRATION_DATA_PLANE_SERVER_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/service/mla_server.h"

namespace mlaserve::integration {

// Server options with the same-host data plane on an abstract socket of this process's own
// (nothing left in the file system), its poller sleeping between calls as on a busy host.
inline service::ServerOptions WithDataPlane(service::ServerOptions options = {}) {
  static int next = 0;
  options.data_plane_socket =
      absl::StrCat("@mlaserve-test-", getpid(), "-", ++next, "-", absl::ToUnixNanos(absl::Now()));
  return options;
}

}  // namespace mlaserve::integration

#endif  // MLASERVE_TESTS_INTEGRATION_DATA_PLANE_SERVER_H_
