#ifndef MLASERVE_TESTS_TESTING_HEALTH_PROBE_H_
#define MLASERVE_TESTS_TESTING_HEALTH_PROBE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"

namespace mlaserve::testing {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// grpc.health.v1.Health/Check for `service` ("" = the whole server), as a probe (Kubernetes,
// grpc-health-probe) sends it. Debian 12 ships no health.proto, and the two messages are a
// string and an enum, so they are encoded by hand.
absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service);

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_HEALTH_PROBE_H_
