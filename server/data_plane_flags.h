#ifndef MLASERVE_SERVER_DATA_PLANE_FLAGS_H_
#define MLASERVE_SERVER_DATA_PLANE_FLAGS_H_

#include "absl/status/status.h"
#include "server/service/mla_server.h"

namespace mlaserve {

// The same-host data plane's flags (docs/deploy.md, "Data planes"): --data_plane_socket,
// --data_plane_poll_us and the registered-memory caps, into `server`.
absl::Status ParseDataPlaneFlags(service::ServerOptions& server);

}  // namespace mlaserve

#endif  // MLASERVE_SERVER_DATA_PLANE_FLAGS_H_
