#ifndef MLASERVE_SERVER_LISTENER_HTTP2_GUARD_H_
#define MLASERVE_SERVER_LISTENER_HTTP2_GUARD_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "server/listener/client_rates.h"
#include "server/listener/http2_guard_limits.h"
#include "server/listener/rate_bucket.h"

namespace mlaserve::listener {

// Where the guard's bytes go: on to gRPC, or back to the client.
struct GuardOutput {
  std::string to_server;
  std::string to_client;
};

// Why the guard ended a connection (a GOAWAY told the client).
enum class GuardClose {
  kResets,    // RST_STREAM frames past the connection's or the client's rate
  kStreams,   // streams opened past the rate
  kProtocol,  // no HTTP/2 preface, or a frame larger than gRPC takes
};
const char* GuardCloseName(GuardClose reason);

// One client connection's HTTP/2 between the client and gRPC, read as it passes (no I/O
// here: the listener moves the bytes). It
//   * counts the client's stream openings and RST_STREAM frames against token buckets (the
//     connection's, and the client's shared by all its connections) and past either ends the
//     connection with GOAWAY(ENHANCE_YOUR_CALM): rapid reset (CVE-2023-44487) ends within
//     one burst instead of queueing hundreds of thousands of cancelled calls in gRPC;
//   * reads every gRPC message prefix on the client's DATA and refuses a message that declares
//     more than the limit at its prefix: the client gets RESOURCE_EXHAUSTED and RST_STREAM
//     (NO_ERROR, "stop sending"), gRPC gets RST_STREAM(CANCEL), and what the client still
//     sends on that stream is dropped and its flow-control credit given back, so the body is
//     never buffered. gRPC 1.51 would read the whole body before refusing it.
// Frames the guard adds to the client's byte stream go in at frame boundaries of gRPC's; the
// header blocks it writes leave HPACK state alone (http2_frames.h). Not thread-safe: one
// connection, one relay thread.
class Http2Guard {
 public:
  struct Counters {
    int64_t streams = 0;
    int64_t resets = 0;
    int64_t refused_messages = 0;
  };

  Http2Guard(const Http2GuardLimits& limits, std::shared_ptr<ClientRates> client, absl::Time now);

  // Bytes the client sent. Returns why the connection must end (the GOAWAY is in
  // out.to_client; nothing more should go to gRPC), or nothing.
  std::optional<GuardClose> FromClient(std::string_view bytes, absl::Time now, GuardOutput& out);
  // Bytes gRPC sent towards the client.
  void FromServer(std::string_view bytes, GuardOutput& out);

  const Counters& counters() const { return counters_; }
  // Why the guard refused the last message, for the listener's log.
  const std::string& last_refusal() const { return last_refusal_; }

 private:
  struct Stream {
    // The current gRPC message: prefix bytes gathered, then body bytes still to come.
    unsigned char prefix[5] = {};
    int prefix_bytes = 0;
    int64_t body_left = 0;
    bool server_sent_headers = false;
  };
  // Frames from the client, whole (at most max_frame_bytes each).
  std::optional<GuardClose> ClientFrame(std::string_view frame, absl::Time now, GuardOutput& out);
  // A DATA payload's gRPC bytes: the declared length of a message over the limit, if any.
  std::optional<int64_t> Deframe(Stream& stream, std::string_view data) const;
  void Refuse(uint32_t stream_id, Stream& stream, int64_t declared, GuardOutput& out);
  // Counts a reset against the connection's and the client's buckets; false past either.
  bool TakeReset(absl::Time now);
  // Gives the client's connection window back what the guard dropped, as gRPC would have.
  void ReturnCredit(uint32_t bytes, GuardOutput& out);
  std::optional<GuardClose> Close(GuardClose reason, GuardOutput& out);
  // Frames for the client wait for a boundary between gRPC's frames.
  void QueueForClient(GuardOutput& out, std::string frames);
  void ForgetRefused(uint32_t stream_id);
  // gRPC advertises frames of megabytes (its flow control sizes them); the client is told at
  // most max_frame_bytes instead, so the guard need hold no more than one such frame whole.
  void CapFrameSize(std::string& settings) const;

  Http2GuardLimits limits_;
  std::shared_ptr<ClientRates> client_;
  RateBucket resets_;
  RateBucket streams_;
  Counters counters_;
  std::string last_refusal_;

  // Client direction: the preface still expected, then bytes of an incomplete frame.
  size_t preface_seen_ = 0;
  std::string partial_;
  uint32_t last_client_stream_ = 0;
  bool closed_ = false;
  absl::flat_hash_map<uint32_t, Stream> streams_open_;
  // Streams the guard refused: their DATA and resets from either side are dropped. Bounded:
  // the oldest are forgotten first (refusals also count as resets).
  absl::flat_hash_set<uint32_t> refused_;
  std::deque<uint32_t> refused_order_;

  // Server direction, streamed: the header being gathered, then payload bytes left of the
  // current frame and whether they are dropped.
  char server_header_[9] = {};
  int server_header_bytes_ = 0;
  uint32_t server_payload_left_ = 0;
  bool server_dropping_ = false;
  std::string client_pending_;   // guard frames waiting for a boundary in gRPC's
  std::string server_settings_;  // a SETTINGS frame of gRPC's being gathered
};

}  // namespace mlaserve::listener

#endif  // MLASERVE_SERVER_LISTENER_HTTP2_GUARD_H_
