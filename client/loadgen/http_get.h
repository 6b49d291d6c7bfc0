#ifndef MLASERVE_CLIENT_LOADGEN_HTTP_GET_H_
#define MLASERVE_CLIENT_LOADGEN_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/mlaserve_client.h"

namespace mlaserve::loadgen {

// GET `path` from `host_port` ("host:port" or "[v6]:port") the way Prometheus scrapes
// /metrics: plain HTTP, or HTTPS when `tls` is enabled (the server's certificate checked
// against tls.ca_pem and the target's host; tls.cert_pem/key_pem presented when set, for a
// server under mutual TLS). The body of a 200 answer; UNAVAILABLE if the server cannot be
// reached, refuses the handshake or answers late (`timeout` bounds connect and each read),
// INTERNAL for any other status.
absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout, const client::ClientTls& tls = {});

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_HTTP_GET_H_
