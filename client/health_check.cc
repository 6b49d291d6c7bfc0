#include "client/health_check.h"

#include <chrono>
#include <future>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace mlaserve::client {

const char* ServingStatusName(ServingStatus status) {
  switch (status) {
    case ServingStatus::kServing:
      return "SERVING";
    case ServingStatus::kNotServing:
      return "NOT_SERVING";
    case ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case ServingStatus::kUnknown:
      break;
  }
  return "UNKNOWN";
}

absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service, absl::Duration timeout) {
  // HealthCheckRequest { string service = 1; }: tag 0x0a, length, bytes (short names only).
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes.push_back(0x0a);
    request_bytes.push_back(static_cast<char>(service.size()));
    request_bytes += service;
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::GenericStub stub(channel);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(status); });
  const grpc::Status status = done.get_future().get();
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse { ServingStatus status = 1; }: tag 0x08, a one-byte varint; an
  // absent field is UNKNOWN (0).
  if (bytes.empty()) return ServingStatus::kUnknown;
  if (bytes.size() != 2 || bytes[0] != 0x08)
    return absl::InternalError("unexpected health response");
  return static_cast<ServingStatus>(bytes[1]);
}

}  // namespace mlaserve::client
