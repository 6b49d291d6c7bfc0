#include "server/service/call_deadline.h"

#include <chrono>

namespace mlaserve::service {

absl::Time CallDeadline(const grpc::ServerContextBase& context) {
  const std::chrono::system_clock::time_point deadline = context.deadline();
  // gRPC reports "no deadline" as the largest time point, which absl would overflow on.
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

}  // namespace mlaserve::service
