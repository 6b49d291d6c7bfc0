#ifndef MLASERVE_SERVER_SERVICE_STATUS_MAPPING_H_
#define MLASERVE_SERVER_SERVICE_STATUS_MAPPING_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace mlaserve::service {

// The one place where the server's absl::Status becomes a grpc::Status. The two code
// spaces are numerically equal (both are google.rpc.Code), so the code is carried over
// unchanged and the message as it is; which code a situation gets is decided where the
// status is made (the engine, or the edge's own validation), never here.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_STATUS_MAPPING_H_
