#ifndef MLASERVE_SERVER_LISTENER_HTTP2_GUARD_LIMITS_H_
#define MLASERVE_SERVER_LISTENER_HTTP2_GUARD_LIMITS_H_

#include <cstdint>

namespace mlaserve::listener {

// What one client connection, and one client over all its connections, may do before the
// HTTP/2 guard ends the connection (docs/deploy.md, "HTTP/2 guard"). The reset rate is the
// flood's signature (CVE-2023-44487); honest clients reset only the calls they cancel or whose
// deadline passes. Stream openings are bounded far above any honest rate: a client's unary
// calls each open one.
struct Http2GuardLimits {
  // A gRPC message whose prefix declares more is refused before its body is read.
  int64_t max_message_bytes = int64_t{64} << 20;
  // Client RST_STREAM frames a connection may send at once, and sustained per second.
  double reset_burst = 1000;
  double resets_per_second = 200;
  // Streams a connection may open at once, and sustained per second.
  double stream_burst = 20000;
  double streams_per_second = 20000;
  // A client (its address, all its connections) gets this many times a connection's rates.
  double client_factor = 4;
  // The largest frame a client may send: the guard lowers gRPC's SETTINGS_MAX_FRAME_SIZE
  // (megabytes, sized by its flow control) to this as it passes, so that it holds at most one
  // such frame per connection; a client sending more broke the setting it was given.
  uint32_t max_frame_bytes = 16384;
};

}  // namespace mlaserve::listener

#endif  // MLASERVE_SERVER_LISTENER_HTTP2_GUARD_LIMITS_H_
