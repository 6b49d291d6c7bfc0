#ifndef MLASERVE_SERVER_DATA_PLANE_FLAGS_H_
#define MLASERVE_SERVER_DATA_PLANE_FLAGS_H_

#include "absl/status/status.h"
#include "server/service/mla_server.h"

namespace mlaserve {

// The data planes' flags (docs/deploy.md, "Data planes"): the same-host plane's
// --data_plane_socket, --data_plane_poll_us and registered-memory caps, and the UCX plane's
// --data_plane_ucx, --data_plane_ucx_trusted_fabric and in-flight caps, into `server`.
absl::Status ParseDataPlaneFlags(service::ServerOptions& server);

}  // namespace mlaserve

#endif  // MLASERVE_SERVER_DATA_PLANE_FLAGS_H_
