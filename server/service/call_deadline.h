#ifndef MLASERVE_SERVER_SERVICE_CALL_DEADLINE_H_
#define MLASERVE_SERVER_SERVICE_CALL_DEADLINE_H_

#include "absl/time/time.h"
#include "grpcpp/server_context.h"

namespace mlaserve::service {

// The client's deadline for a call, as the engine takes it (absl::InfiniteFuture() when the
// client set none).
absl::Time CallDeadline(const grpc::ServerContextBase& context);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_CALL_DEADLINE_H_
