#ifndef MLASERVE_CLIENT_LOADGEN_HTTP_GET_H_
#define MLASERVE_CLIENT_LOADGEN_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mlaserve::loadgen {

// GET http://`host_port``path` over plain HTTP/1.0 (so the answer is neither chunked nor kept
// alive: the body is everything after the headers until the server closes), the way
// Prometheus scrapes /metrics. The body of a 200 answer; UNAVAILABLE if the server cannot
// be reached or answers late (`timeout` bounds connect and each read), INTERNAL for any
// other status line. `host_port` is "host:port" or "[v6]:port".
absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_HTTP_GET_H_
