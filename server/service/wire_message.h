#ifndef MLASERVE_SERVER_SERVICE_WIRE_MESSAGE_H_
#define MLASERVE_SERVER_SERVICE_WIRE_MESSAGE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"

namespace mlaserve::service {

// The service reads and writes its messages itself (gRPC's raw callback methods) so that a
// message that does not parse is answered: gRPC's own parsing ends a unary call with
// UNIMPLEMENTED and no message, and inside a stream takes it for the client's half-close.
//
// INVALID_ARGUMENT naming `what` (the request, or a stream's message by index) if `bytes`
// is not a `Message`.
template <typename Message>
absl::Status ParseWireMessage(const grpc::ByteBuffer& bytes, absl::string_view what,
                              Message* message) {
  grpc::ByteBuffer view(bytes);  // shares the slices: no copy of the payload
  if (grpc::SerializationTraits<Message>::Deserialize(&view, message).ok()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", bytes.Length(),
                                                 " bytes that are not a valid ",
                                                 Message::descriptor()->full_name(), " message"));
}

template <typename Message>
void SerializeWireMessage(const Message& message, grpc::ByteBuffer* bytes) {
  bool own_buffer = false;
  // Fails only for messages over 2 GiB, which the server's answers never reach.
  (void)grpc::SerializationTraits<Message>::Serialize(message, bytes, &own_buffer);
}

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_WIRE_MESSAGE_H_
