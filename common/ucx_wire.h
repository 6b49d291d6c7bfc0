#ifndef MLASERVE_COMMON_UCX_WIRE_H_
#define MLASERVE_COMMON_UCX_WIRE_H_

#include <cstdint>
#include <cstring>
#include <optional>

// The cross-host data plane's framing over UCX active messages (docs/api.md, "The UCX
// plane"), shared by the server (server/dataplane/ucx_*) and the client
// (client/dataplane/ucx_channel.*). Every message is one active message; its id says what it
// carries, its data is one protobuf message.
namespace mlaserve::ucx {

// The protocol version in UcxHello / UcxWelcome and DataPlane.version; a client speaking
// another is refused FAILED_PRECONDITION naming both.
inline constexpr uint32_t kUcxVersion = 1;

// Client to server.
inline constexpr unsigned kAmHello = 1;  // data: UcxHello, header: none
inline constexpr unsigned kAmCall = 2;   // data: DataPlaneCall, header: the call id
// Server to client.
inline constexpr unsigned kAmWelcome = 3;  // data: UcxWelcome, header: none
inline constexpr unsigned kAmAnswer = 4;   // data: DataPlaneAnswer, header: the call id

// A hello is a version and a 16-byte ticket; anything much longer is not one.
inline constexpr uint64_t kMaxHelloBytes = 4096;

// The call id as an active message's header: 8 bytes, little-endian (x86 and arm64 are).
inline constexpr size_t kCallIdBytes = sizeof(uint64_t);
inline void WriteCallId(uint64_t id, unsigned char (&header)[kCallIdBytes]) {
  std::memcpy(header, &id, kCallIdBytes);
}
inline std::optional<uint64_t> ReadCallId(const void* header, size_t length) {
  if (header == nullptr || length != kCallIdBytes) return std::nullopt;
  uint64_t id;
  std::memcpy(&id, header, kCallIdBytes);
  return id;
}

}  // namespace mlaserve::ucx

#endif  // MLASERVE_COMMON_UCX_WIRE_H_
