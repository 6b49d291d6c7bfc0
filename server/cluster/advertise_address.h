#ifndef MLASERVE_SERVER_CLUSTER_ADVERTISE_ADDRESS_H_
#define MLASERVE_SERVER_CLUSTER_ADVERTISE_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace mlaserve::cluster {

// The host:port a server writes in its etcd record for clients to dial: `advertised` if
// given, else `listen`'s host with the port the server got (`port`, for --listen=...:0), the
// machine's host name in place of a wildcard host (0.0.0.0, ::), which no client can dial.
absl::StatusOr<std::string> AdvertiseAddress(const std::string& advertised,
                                             const std::string& listen, int port);

}  // namespace mlaserve::cluster

#endif  // MLASERVE_SERVER_CLUSTER_ADVERTISE_ADDRESS_H_
