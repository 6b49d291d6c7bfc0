#ifndef MLASERVE_CLIENT_HEALTH_CHECK_H_
#define MLASERVE_CLIENT_HEALTH_CHECK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"

namespace mlaserve::client {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// grpc.health.v1.Health/Check for `service` ("" = the whole server), as a probe (Kubernetes,
// grpc-health-probe) sends it. Debian 12 ships no health.proto, and the two messages are a
// string and an enum, so they are encoded by hand.
// UNAVAILABLE or DEADLINE_EXCEEDED (after `timeout`) when the server does not answer.
absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service,
                                          absl::Duration timeout = absl::Seconds(5));

// "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN".
const char* ServingStatusName(ServingStatus status);

}  // namespace mlaserve::client

#endif  // MLASERVE_CLIENT_HEALTH_CHECK_H_
