#include "server/listener/http2_guard.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/listener/http2_frames.h"

namespace mlaserve::listener {
namespace {

// Refused streams remembered (their late frames dropped); older ones pass through to gRPC,
// which has reset them and ignores what comes.
constexpr size_t kRefusedRemembered = 1024;
constexpr int kResourceExhausted = 8;  // grpc::StatusCode::RESOURCE_EXHAUSTED

}  // namespace

const char* GuardCloseName(GuardClose reason) {
  switch (reason) {
    case GuardClose::kResets:
      return "too many resets";
    case GuardClose::kStreams:
      return "too many streams opened";
    case GuardClose::kProtocol:
      return "protocol error";
  }
  return "unknown";
}

Http2Guard::Http2Guard(const Http2GuardLimits& limits, std::shared_ptr<ClientRates> client,
                       absl::Time now)
    : limits_(limits),
      client_(std::move(client)),
      resets_(limits.reset_burst, limits.resets_per_second, now),
      streams_(limits.stream_burst, limits.streams_per_second, now) {}

std::optional<GuardClose> Http2Guard::FromClient(std::string_view bytes, absl::Time now,
                                                 GuardOutput& out) {
  if (closed_) return std::nullopt;
  while (preface_seen_ < kClientPreface.size() && !bytes.empty()) {
    if (bytes.front() != kClientPreface[preface_seen_]) {
      last_refusal_ = "no HTTP/2 client preface";
      return Close(GuardClose::kProtocol, out);
    }
    out.to_server.push_back(bytes.front());
    ++preface_seen_;
    bytes.remove_prefix(1);
  }
  // Whole frames straight from `bytes` where possible; an incomplete one waits in partial_.
  std::string joined;
  if (!partial_.empty()) {
    joined = std::move(partial_);
    joined.append(bytes);
    partial_.clear();
    bytes = joined;
  }
  while (bytes.size() >= kFrameHeaderBytes) {
    const FrameHeader header = FrameHeader::Parse(bytes.data());
    if (header.length > limits_.max_frame_bytes) {
      last_refusal_ =
          absl::StrCat("a frame of ", header.length, " bytes (type ", static_cast<int>(header.type),
                       "), over the limit of ", limits_.max_frame_bytes);
      return Close(GuardClose::kProtocol, out);
    }
    const size_t frame_bytes = kFrameHeaderBytes + header.length;
    if (bytes.size() < frame_bytes) break;
    if (std::optional<GuardClose> closed = ClientFrame(bytes.substr(0, frame_bytes), now, out)) {
      return closed;
    }
    bytes.remove_prefix(frame_bytes);
  }
  partial_.assign(bytes);
  return std::nullopt;
}

std::optional<GuardClose> Http2Guard::ClientFrame(std::string_view frame, absl::Time now,
                                                  GuardOutput& out) {
  const FrameHeader header = FrameHeader::Parse(frame.data());
  const uint32_t id = header.stream_id;
  const bool refused = refused_.contains(id);
  switch (header.type) {
    case FrameType::kHeaders:
      // Header blocks always go on, even on a refused stream: they carry HPACK state.
      if (!refused && id > last_client_stream_ && (id & 1) == 1) {
        last_client_stream_ = id;
        ++counters_.streams;
        if (!streams_.Take(now) || (client_ != nullptr && !client_->TakeStream(now))) {
          return Close(GuardClose::kStreams, out);
        }
        streams_open_.try_emplace(id);
      }
      break;
    case FrameType::kData: {
      if (refused) {
        ReturnCredit(header.length, out);  // dropped
        return std::nullopt;
      }
      auto it = streams_open_.find(id);
      if (it == streams_open_.end()) break;
      std::string_view data = frame.substr(kFrameHeaderBytes);
      if ((header.flags & kFlagPadded) != 0 && !data.empty()) {
        const size_t padding = static_cast<unsigned char>(data.front());
        if (padding + 1 > data.size()) break;  // malformed: gRPC answers it
        data = data.substr(1, data.size() - 1 - padding);
      }
      if (const std::optional<int64_t> declared = Deframe(it->second, data)) {
        Refuse(id, it->second, *declared, out);
        ReturnCredit(header.length, out);
        // A refusal costs gRPC a cancelled call, as a reset does: it counts as one.
        if (!TakeReset(now)) return Close(GuardClose::kResets, out);
        return std::nullopt;
      }
      break;
    }
    case FrameType::kRstStream:
      if (refused) return std::nullopt;  // the stream is over already
      if (!TakeReset(now)) return Close(GuardClose::kResets, out);
      streams_open_.erase(id);
      break;
    default:
      break;
  }
  out.to_server.append(frame);
  return std::nullopt;
}

bool Http2Guard::TakeReset(absl::Time now) {
  ++counters_.resets;
  return resets_.Take(now) && (client_ == nullptr || client_->TakeReset(now));
}

void Http2Guard::ReturnCredit(uint32_t bytes, GuardOutput& out) {
  if (bytes == 0) return;
  std::string update;
  AppendWindowUpdate(0, bytes, update);
  QueueForClient(out, std::move(update));
}

std::optional<int64_t> Http2Guard::Deframe(Stream& stream, std::string_view data) const {
  size_t i = 0;
  while (i < data.size()) {
    if (stream.body_left > 0) {
      const size_t take = static_cast<size_t>(
          std::min<int64_t>(stream.body_left, static_cast<int64_t>(data.size() - i)));
      stream.body_left -= static_cast<int64_t>(take);
      i += take;
      continue;
    }
    stream.prefix[stream.prefix_bytes++] = static_cast<unsigned char>(data[i++]);
    if (stream.prefix_bytes == kGrpcPrefixBytes) {
      stream.prefix_bytes = 0;
      const int64_t length = (int64_t{stream.prefix[1]} << 24) | (int64_t{stream.prefix[2]} << 16) |
                             (int64_t{stream.prefix[3]} << 8) | int64_t{stream.prefix[4]};
      if (length > limits_.max_message_bytes) return length;
      stream.body_left = length;
    }
  }
  return std::nullopt;
}

void Http2Guard::Refuse(uint32_t stream_id, Stream& stream, int64_t declared, GuardOutput& out) {
  ++counters_.refused_messages;
  last_refusal_ = absl::StrCat("a message of ", declared, " bytes, over the limit of ",
                               limits_.max_message_bytes, " bytes, on stream ", stream_id);
  std::string frames;
  AppendGrpcStatus(
      stream_id, /*trailers_only=*/!stream.server_sent_headers, kResourceExhausted,
      absl::StrCat("request message of ", declared, " bytes is larger than the server's limit of ",
                   limits_.max_message_bytes,
                   " bytes (--max_message_mb); refused at its length prefix"),
      frames);
  AppendRstStream(stream_id, ErrorCode::kNoError, frames);  // "stop sending the body"
  QueueForClient(out, std::move(frames));
  AppendRstStream(stream_id, ErrorCode::kCancel, out.to_server);
  streams_open_.erase(stream_id);
  refused_.insert(stream_id);
  refused_order_.push_back(stream_id);
  if (refused_order_.size() > kRefusedRemembered) ForgetRefused(refused_order_.front());
}

void Http2Guard::ForgetRefused(uint32_t stream_id) {
  refused_.erase(stream_id);
  refused_order_.erase(std::find(refused_order_.begin(), refused_order_.end(), stream_id));
}

std::optional<GuardClose> Http2Guard::Close(GuardClose reason, GuardOutput& out) {
  closed_ = true;
  std::string goaway;
  AppendGoAway(
      last_client_stream_,
      reason == GuardClose::kProtocol ? ErrorCode::kProtocolError : ErrorCode::kEnhanceYourCalm,
      absl::StrCat("mlaserve: ", GuardCloseName(reason)), goaway);
  QueueForClient(out, std::move(goaway));
  return reason;
}

void Http2Guard::QueueForClient(GuardOutput& out, std::string frames) {
  if (server_header_bytes_ == 0 && server_payload_left_ == 0) {
    out.to_client.append(frames);
  } else {
    client_pending_.append(frames);
  }
}

void Http2Guard::CapFrameSize(std::string& settings) const {
  for (size_t at = kFrameHeaderBytes; at + 6 <= settings.size(); at += 6) {
    auto* entry = reinterpret_cast<unsigned char*>(settings.data() + at);
    if (((uint32_t{entry[0]} << 8) | entry[1]) != kSettingsMaxFrameSize) continue;
    const uint32_t value = (uint32_t{entry[2]} << 24) | (uint32_t{entry[3]} << 16) |
                           (uint32_t{entry[4]} << 8) | entry[5];
    const uint32_t capped = std::min(value, limits_.max_frame_bytes);
    for (int i = 0; i < 4; ++i) entry[2 + i] = static_cast<unsigned char>(capped >> (24 - 8 * i));
  }
}

void Http2Guard::FromServer(std::string_view bytes, GuardOutput& out) {
  while (!bytes.empty()) {
    if (server_payload_left_ > 0) {
      const size_t take = std::min<size_t>(server_payload_left_, bytes.size());
      if (!server_settings_.empty()) {
        server_settings_.append(bytes.substr(0, take));
      } else if (!server_dropping_) {
        out.to_client.append(bytes.substr(0, take));
      }
      bytes.remove_prefix(take);
      server_payload_left_ -= static_cast<uint32_t>(take);
      if (server_payload_left_ == 0 && !server_settings_.empty()) {
        CapFrameSize(server_settings_);
        out.to_client.append(server_settings_);
        server_settings_.clear();
      }
    } else {
      const size_t take = std::min<size_t>(kFrameHeaderBytes - server_header_bytes_, bytes.size());
      std::memcpy(server_header_ + server_header_bytes_, bytes.data(), take);
      server_header_bytes_ += static_cast<int>(take);
      bytes.remove_prefix(take);
      if (server_header_bytes_ < kFrameHeaderBytes) break;
      server_header_bytes_ = 0;
      const FrameHeader header = FrameHeader::Parse(server_header_);
      server_dropping_ = false;
      if (refused_.contains(header.stream_id)) {
        // gRPC's answer to a stream the guard answered: its DATA and resets are dropped (the
        // DATA's connection credit returned to gRPC); header blocks go on for HPACK's sake.
        if (header.type == FrameType::kData) {
          server_dropping_ = true;
          if (header.length > 0) AppendWindowUpdate(0, header.length, out.to_server);
        } else if (header.type == FrameType::kRstStream) {
          server_dropping_ = true;
        }
      } else if (header.type == FrameType::kHeaders) {
        auto it = streams_open_.find(header.stream_id);
        if (it != streams_open_.end()) {
          it->second.server_sent_headers = true;
          if ((header.flags & kFlagEndStream) != 0) streams_open_.erase(it);
        }
      } else if (header.type == FrameType::kRstStream) {
        streams_open_.erase(header.stream_id);
      }
      server_payload_left_ = header.length;
      if (header.type == FrameType::kSettings && (header.flags & kSettingsAck) == 0 &&
          header.length > 0) {
        // Held whole (a few entries) so that its frame size can be capped before it goes on.
        server_settings_.assign(server_header_, kFrameHeaderBytes);
      } else if (!server_dropping_) {
        out.to_client.append(server_header_, kFrameHeaderBytes);
      }
    }
    if (server_header_bytes_ == 0 && server_payload_left_ == 0 && !client_pending_.empty()) {
      out.to_client.append(client_pending_);
      client_pending_.clear();
    }
  }
}

}  // namespace mlaserve::listener
