#ifndef MLASERVE_SERVER_LISTENER_HTTP2_FRAMES_H_
#define MLASERVE_SERVER_LISTENER_HTTP2_FRAMES_H_

// The few pieces of HTTP/2 (RFC 9113) and gRPC's framing over it (PROTOCOL-HTTP2.md) that the
// HTTP/2 guard reads and writes. It reads frame headers and gRPC message prefixes, never header
// blocks; what it writes to a client never touches either side's HPACK dynamic table (static
// table references and literals without indexing only), so frames it adds between gRPC's keep
// both HPACK states in step.

#include <cstdint>
#include <string>
#include <string_view>

namespace mlaserve::listener {

// The client connection preface that precedes the first frame.
inline constexpr std::string_view kClientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
inline constexpr int kFrameHeaderBytes = 9;
// A gRPC message's prefix: a compressed flag, then the length (big-endian, 32 bits).
inline constexpr int kGrpcPrefixBytes = 5;

enum class FrameType : uint8_t {
  kData = 0x0,
  kHeaders = 0x1,
  kPriority = 0x2,
  kRstStream = 0x3,
  kSettings = 0x4,
  kPushPromise = 0x5,
  kPing = 0x6,
  kGoAway = 0x7,
  kWindowUpdate = 0x8,
  kContinuation = 0x9,
};

inline constexpr uint8_t kFlagEndStream = 0x1;
inline constexpr uint8_t kFlagEndHeaders = 0x4;
inline constexpr uint8_t kFlagPadded = 0x8;
inline constexpr uint8_t kFlagPriority = 0x20;
inline constexpr uint8_t kSettingsAck = 0x1;
inline constexpr uint16_t kSettingsMaxFrameSize = 0x5;

enum class ErrorCode : uint32_t {
  kNoError = 0x0,
  kProtocolError = 0x1,
  kCancel = 0x8,
  kFrameSizeError = 0x6,
  kEnhanceYourCalm = 0xb,
};

struct FrameHeader {
  uint32_t length = 0;  // payload bytes, 24 bits
  FrameType type = FrameType::kData;
  uint8_t flags = 0;
  uint32_t stream_id = 0;  // 31 bits

  // Reads the 9 bytes at `bytes` (at least that many).
  static FrameHeader Parse(const char* bytes);
  void AppendTo(std::string& out) const;
};

// A GOAWAY: no streams past `last_stream_id` were or will be processed.
void AppendGoAway(uint32_t last_stream_id, ErrorCode code, std::string_view debug,
                  std::string& out);
void AppendRstStream(uint32_t stream_id, ErrorCode code, std::string& out);
void AppendWindowUpdate(uint32_t stream_id, uint32_t increment, std::string& out);

// A gRPC status ending stream `stream_id`: a Trailers-Only response (`:status 200`,
// content-type, grpc-status, grpc-message) when the server has sent no headers on it yet, or
// trailers (grpc-status, grpc-message) after the server's own response headers. The message is
// percent-encoded as gRPC asks.
void AppendGrpcStatus(uint32_t stream_id, bool trailers_only, int grpc_status,
                      std::string_view message, std::string& out);

}  // namespace mlaserve::listener

#endif  // MLASERVE_SERVER_LISTENER_HTTP2_FRAMES_H_
