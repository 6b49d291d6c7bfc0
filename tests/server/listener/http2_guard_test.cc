#include "server/listener/http2_guard.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/listener/client_rates.h"

namespace mlaserve::listener {
namespace {

using ::testing::HasSubstr;

// Frames written here byte by byte from RFC 9113, independently of http2_frames.cc.
std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  const auto length = static_cast<uint32_t>(payload.size());
  f.push_back(static_cast<char>(length >> 16));
  f.push_back(static_cast<char>(length >> 8));
  f.push_back(static_cast<char>(length));
  f.push_back(static_cast<char>(type));
  f.push_back(static_cast<char>(flags));
  for (int shift = 24; shift >= 0; shift -= 8) f.push_back(static_cast<char>(stream >> shift));
  return f + payload;
}
std::string Word(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}
constexpr uint8_t kData = 0, kHeaders = 1, kRst = 3, kSettings = 4, kGoAway = 7, kWindow = 8;
std::string Headers(uint32_t stream) { return Frame(kHeaders, 0x4, stream, "\x82\x86"); }
std::string Rst(uint32_t stream, uint32_t code = 8) { return Frame(kRst, 0, stream, Word(code)); }
// A gRPC message: its 5-byte prefix declaring `declared` bytes, then `body`.
std::string Message(uint32_t declared, const std::string& body) {
  return std::string(1, '\0') + Word(declared) + body;
}
std::string Data(uint32_t stream, const std::string& payload, uint8_t flags = 0) {
  return Frame(kData, flags, stream, payload);
}
const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

struct ParsedFrame {
  uint8_t type;
  uint8_t flags;
  uint32_t stream;
  std::string payload;
};
std::vector<ParsedFrame> Parse(const std::string& bytes) {
  std::vector<ParsedFrame> frames;
  size_t at = 0;
  while (at + 9 <= bytes.size()) {
    const auto* b = reinterpret_cast<const unsigned char*>(bytes.data() + at);
    const uint32_t length = (b[0] << 16) | (b[1] << 8) | b[2];
    const uint32_t stream = ((b[5] & 0x7f) << 24) | (b[6] << 16) | (b[7] << 8) | b[8];
    frames.push_back({b[3], b[4], stream, bytes.substr(at + 9, length)});
    at += 9 + length;
  }
  EXPECT_EQ(at, bytes.size()) << "bytes after the last whole frame";
  return frames;
}
uint32_t WordAt(const std::string& s, size_t at) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data() + at);
  return (uint32_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
}

class Http2GuardTest : public ::testing::Test {
 protected:
  Http2GuardTest() { limits_.max_message_bytes = 1000; }
  std::unique_ptr<Http2Guard> NewGuard(std::shared_ptr<ClientRates> rates = nullptr) {
    auto guard = std::make_unique<Http2Guard>(limits_, rates, now_);
    GuardOutput out;
    EXPECT_FALSE(guard->FromClient(kPreface + Frame(kSettings, 0, 0, ""), now_, out));
    return guard;
  }
  Http2GuardLimits limits_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

TEST_F(Http2GuardTest, FramesPassUnchangedWhateverTheirSplitIntoReads) {
  const std::string stream = kPreface + Frame(kSettings, 0, 0, "") + Headers(1) +
                             Data(1, Message(3, "abc"), 0x1) + Frame(kWindow, 0, 0, Word(100));
  for (size_t chunk : {size_t{1}, size_t{7}, stream.size()}) {
    Http2Guard guard(limits_, nullptr, now_);
    GuardOutput out;
    for (size_t at = 0; at < stream.size(); at += chunk) {
      ASSERT_FALSE(guard.FromClient(stream.substr(at, chunk), now_, out));
    }
    EXPECT_EQ(out.to_server, stream) << "read " << chunk << " bytes at a time";
    EXPECT_TRUE(out.to_client.empty());
  }
}

TEST_F(Http2GuardTest, ARapidResetFloodEndsWithGoAwayAfterTheBurst) {
  auto guard = NewGuard();
  GuardOutput out;
  std::optional<GuardClose> closed;
  uint32_t stream = 1;
  int pairs = 0;
  for (; pairs < 5000 && !closed; ++pairs, stream += 2) {
    closed = guard->FromClient(Headers(stream) + Rst(stream), now_, out);
  }
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(*closed, GuardClose::kResets);
  EXPECT_EQ(pairs, static_cast<int>(limits_.reset_burst) + 1);
  const std::vector<ParsedFrame> to_client = Parse(out.to_client);
  ASSERT_EQ(to_client.size(), 1u);
  EXPECT_EQ(to_client[0].type, kGoAway);
  EXPECT_EQ(WordAt(to_client[0].payload, 0), stream - 2);  // the last stream it saw
  EXPECT_EQ(WordAt(to_client[0].payload, 4), 0xbu);        // ENHANCE_YOUR_CALM
  // gRPC got the burst's resets, not the one past it.
  int resets_forwarded = 0;
  for (const ParsedFrame& f : Parse(out.to_server)) resets_forwarded += f.type == kRst;
  EXPECT_EQ(resets_forwarded, static_cast<int>(limits_.reset_burst));
  EXPECT_EQ(guard->counters().resets, limits_.reset_burst + 1);
  EXPECT_EQ(guard->counters().streams, limits_.reset_burst + 1);
}

TEST_F(Http2GuardTest, ResetsWithinTheSustainedRateNeverEndTheConnection) {
  auto guard = NewGuard();
  GuardOutput out;
  uint32_t stream = 1;
  // 10 s of a client cancelling 150 calls a second (under 200/s) among 5,000 calls a second.
  for (int tick = 0; tick < 1000; ++tick) {
    now_ += absl::Milliseconds(10);
    for (int call = 0; call < 50; ++call, stream += 2) {
      std::string frames = Headers(stream) + Data(stream, Message(2, "hi"), 0x1);
      if (call < 2 && tick % 2 == 0) frames += Rst(stream);  // 1.5 of 50 calls
      ASSERT_FALSE(guard->FromClient(frames, now_, out)) << "tick " << tick;
      out.to_server.clear();
    }
  }
  EXPECT_EQ(guard->counters().streams, 50000);
}

TEST_F(Http2GuardTest, StreamsOpenedPastTheRateEndTheConnection) {
  limits_.stream_burst = 100;
  limits_.streams_per_second = 10;
  auto guard = NewGuard();
  GuardOutput out;
  std::optional<GuardClose> closed;
  uint32_t stream = 1;
  for (int i = 0; i < 200 && !closed; ++i, stream += 2) {
    closed = guard->FromClient(Headers(stream), now_, out);
  }
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(*closed, GuardClose::kStreams);
  EXPECT_EQ(guard->counters().streams, 101);
}

TEST_F(Http2GuardTest, AClientsConnectionsShareItsRates) {
  limits_.client_factor = 1.5;  // the client may reset 1.5 connections' worth
  auto rates = std::make_shared<ClientRates>(limits_, now_);
  auto first = NewGuard(rates);
  auto second = NewGuard(rates);
  GuardOutput out;
  uint32_t stream = 1;
  for (int i = 0; i < 900; ++i, stream += 2) {
    ASSERT_FALSE(first->FromClient(Headers(stream) + Rst(stream), now_, out));
  }
  std::optional<GuardClose> closed;
  int more = 0;
  for (; more < 900 && !closed; ++more, stream += 2) {
    closed = second->FromClient(Headers(stream) + Rst(stream), now_, out);
  }
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(*closed, GuardClose::kResets);
  EXPECT_EQ(more, 1500 - 900 + 1);  // each under its own 1,000; together past 1,500
}

TEST_F(Http2GuardTest, AMessageDeclaringMoreThanTheLimitIsRefusedAtItsPrefix) {
  auto guard = NewGuard();
  GuardOutput out;
  ASSERT_FALSE(
      guard->FromClient(Headers(1) + Data(1, Message(1000, std::string(1000, 'x'))), now_, out));
  out = {};
  // The prefix split over two frames: the second completes it (1001 > 1000).
  const std::string prefix = Message(1001, "");
  ASSERT_FALSE(guard->FromClient(Data(1, prefix.substr(0, 2)), now_, out));
  ASSERT_FALSE(guard->FromClient(Data(1, prefix.substr(2) + "body"), now_, out));
  EXPECT_EQ(guard->counters().refused_messages, 1);
  EXPECT_THAT(guard->last_refusal(), HasSubstr("1001 bytes"));

  // gRPC got the first part of the prefix and then a cancel, not the frame that declared it.
  const std::vector<ParsedFrame> to_server = Parse(out.to_server);
  ASSERT_EQ(to_server.size(), 2u);
  EXPECT_EQ(to_server[0].type, kData);
  EXPECT_EQ(to_server[1].type, kRst);
  EXPECT_EQ(WordAt(to_server[1].payload, 0), 8u);  // CANCEL
  // The client: the status (Trailers-Only: gRPC had sent no headers), "stop sending", and the
  // dropped frame's connection credit.
  const std::vector<ParsedFrame> to_client = Parse(out.to_client);
  ASSERT_EQ(to_client.size(), 3u);
  EXPECT_EQ(to_client[0].type, kHeaders);
  EXPECT_EQ(to_client[0].flags, 0x5);  // END_STREAM | END_HEADERS
  EXPECT_EQ(to_client[0].stream, 1u);
  EXPECT_EQ(static_cast<unsigned char>(to_client[0].payload[0]), 0x88);  // :status 200
  EXPECT_THAT(to_client[0].payload, HasSubstr("grpc-status\x01"
                                              "8"));
  EXPECT_THAT(to_client[0].payload, HasSubstr("larger than the server's limit of 1000 bytes"));
  EXPECT_EQ(to_client[1].type, kRst);
  EXPECT_EQ(WordAt(to_client[1].payload, 0), 0u);  // NO_ERROR
  EXPECT_EQ(to_client[2].type, kWindow);
  EXPECT_EQ(WordAt(to_client[2].payload, 0), prefix.size() - 2 + 4);

  // The rest of the body is dropped, its credit given back; the client's reset is not counted.
  out = {};
  ASSERT_FALSE(guard->FromClient(Data(1, std::string(500, 'y')) + Rst(1), now_, out));
  EXPECT_TRUE(out.to_server.empty());
  const std::vector<ParsedFrame> credit = Parse(out.to_client);
  ASSERT_EQ(credit.size(), 1u);
  EXPECT_EQ(WordAt(credit[0].payload, 0), 500u);
  EXPECT_EQ(guard->counters().resets, 1);  // the refusal itself
}

TEST_F(Http2GuardTest, PaddingIsNotReadAsAMessage) {
  auto guard = NewGuard();
  GuardOutput out;
  // Pad length 20, then a 3-byte message, then 20 bytes of padding that would declare 2^32-1.
  const std::string payload = std::string(1, '\x14') + Message(3, "abc") + std::string(20, '\xff');
  ASSERT_FALSE(guard->FromClient(Headers(1) + Data(1, payload, 0x8), now_, out));
  EXPECT_EQ(guard->counters().refused_messages, 0);
}

TEST_F(Http2GuardTest, AFrameOverTheAdvertisedSizeIsAProtocolError) {
  auto guard = NewGuard();
  GuardOutput out;
  const auto closed = guard->FromClient(
      Headers(1) + Data(1, std::string(limits_.max_frame_bytes + 1, 'z')), now_, out);
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(*closed, GuardClose::kProtocol);
  EXPECT_EQ(Parse(out.to_client).back().type, kGoAway);

  Http2Guard not_http2(limits_, nullptr, now_);
  GuardOutput other;
  EXPECT_EQ(not_http2.FromClient("GET / HTTP/1.1\r\n", now_, other), GuardClose::kProtocol);
}

TEST_F(Http2GuardTest, GrpcsFrameSizeSettingIsCappedAndOtherSettingsKept) {
  auto guard = NewGuard();
  GuardOutput out;
  const std::string entries = std::string("\x00\x03", 2) + Word(256) +     // MAX_CONCURRENT
                              std::string("\x00\x05", 2) + Word(4 << 20);  // MAX_FRAME_SIZE
  const std::string settings = Frame(kSettings, 0, 0, entries);
  // In two reads, split inside the payload.
  guard->FromServer(settings.substr(0, 12), out);
  EXPECT_TRUE(out.to_client.empty());
  guard->FromServer(settings.substr(12), out);
  const std::vector<ParsedFrame> frames = Parse(out.to_client);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(WordAt(frames[0].payload, 2), 256u);
  EXPECT_EQ(WordAt(frames[0].payload, 8), limits_.max_frame_bytes);
}

TEST_F(Http2GuardTest, FramesForTheClientWaitForABoundaryInGrpcsAndGrpcsAnswerIsDropped) {
  auto guard = NewGuard();
  GuardOutput out;
  ASSERT_FALSE(guard->FromClient(Headers(1) + Headers(3), now_, out));
  // gRPC is halfway through a DATA frame on stream 3 when stream 1 is refused.
  const std::string grpc_data = Data(3, std::string(100, 'a'));
  guard->FromServer(grpc_data.substr(0, 50), out);
  ASSERT_FALSE(guard->FromClient(Data(1, Message(5000, "")), now_, out));
  EXPECT_EQ(out.to_client, grpc_data.substr(0, 50));
  guard->FromServer(grpc_data.substr(50), out);
  const std::vector<ParsedFrame> frames = Parse(out.to_client);
  ASSERT_EQ(frames.size(), 4u);  // gRPC's frame whole, then the refusal's three
  EXPECT_EQ(frames[0].stream, 3u);
  EXPECT_EQ(frames[1].type, kHeaders);
  EXPECT_EQ(frames[1].stream, 1u);

  // gRPC's own late answer on stream 1: its DATA and reset are dropped (the DATA's credit
  // returned to gRPC); its header block goes on, for HPACK.
  out = {};
  guard->FromServer(Frame(kHeaders, 0x4, 1, "\x88") + Data(1, std::string(30, 'b')) + Rst(1), out);
  const std::vector<ParsedFrame> late = Parse(out.to_client);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].type, kHeaders);
  const std::vector<ParsedFrame> credit = Parse(out.to_server);
  ASSERT_EQ(credit.size(), 1u);
  EXPECT_EQ(credit[0].type, kWindow);
  EXPECT_EQ(WordAt(credit[0].payload, 0), 30u);
}

TEST_F(Http2GuardTest, AfterGrpcsHeadersTheRefusalIsTrailersWithoutAStatusLine) {
  auto guard = NewGuard();
  GuardOutput out;
  ASSERT_FALSE(guard->FromClient(Headers(1) + Data(1, Message(2, "ok")), now_, out));
  guard->FromServer(Frame(kHeaders, 0x4, 1, "\x88"), out);  // gRPC's response headers
  out = {};
  ASSERT_FALSE(guard->FromClient(Data(1, Message(1 << 30, "")), now_, out));
  const std::vector<ParsedFrame> frames = Parse(out.to_client);
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames[0].type, kHeaders);
  EXPECT_NE(static_cast<unsigned char>(frames[0].payload[0]), 0x88);
  EXPECT_THAT(frames[0].payload, HasSubstr("grpc-status"));
}

}  // namespace
}  // namespace mlaserve::listener
