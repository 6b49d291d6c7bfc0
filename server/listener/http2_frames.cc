#include "server/listener/http2_frames.h"

#include "absl/strings/str_cat.h"

namespace mlaserve::listener {
namespace {

void AppendBigEndian(uint32_t value, int bytes, std::string& out) {
  for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

// HPACK's integer with an N-bit prefix (RFC 7541, 5.1), the prefix's high bits `pattern`.
void AppendHpackInteger(uint32_t value, int prefix_bits, uint8_t pattern, std::string& out) {
  const uint32_t limit = (1u << prefix_bits) - 1;
  if (value < limit) {
    out.push_back(static_cast<char>(pattern | value));
    return;
  }
  out.push_back(static_cast<char>(pattern | limit));
  value -= limit;
  while (value >= 128) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// A string literal, not Huffman-coded.
void AppendHpackString(std::string_view text, std::string& out) {
  AppendHpackInteger(static_cast<uint32_t>(text.size()), 7, 0x00, out);
  out.append(text);
}

// "Literal Header Field without Indexing" (RFC 7541, 6.2.2): neither side's table changes.
void AppendLiteralIndexedName(uint32_t static_index, std::string_view value, std::string& out) {
  AppendHpackInteger(static_index, 4, 0x00, out);
  AppendHpackString(value, out);
}
void AppendLiteralNewName(std::string_view name, std::string_view value, std::string& out) {
  out.push_back(0x00);
  AppendHpackString(name, out);
  AppendHpackString(value, out);
}

// gRPC's grpc-message encoding: printable ASCII but '%' as is, everything else %XX.
std::string PercentEncode(std::string_view message) {
  std::string encoded;
  for (const unsigned char c : message) {
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      encoded.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&encoded, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return encoded;
}

}  // namespace

FrameHeader FrameHeader::Parse(const char* bytes) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes);
  FrameHeader header;
  header.length = (uint32_t{b[0]} << 16) | (uint32_t{b[1]} << 8) | b[2];
  header.type = static_cast<FrameType>(b[3]);
  header.flags = b[4];
  header.stream_id =
      ((uint32_t{b[5]} << 24) | (uint32_t{b[6]} << 16) | (uint32_t{b[7]} << 8) | b[8]) &
      0x7fffffffu;
  return header;
}

void FrameHeader::AppendTo(std::string& out) const {
  AppendBigEndian(length, 3, out);
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  AppendBigEndian(stream_id & 0x7fffffffu, 4, out);
}

void AppendGoAway(uint32_t last_stream_id, ErrorCode code, std::string_view debug,
                  std::string& out) {
  FrameHeader{static_cast<uint32_t>(8 + debug.size()), FrameType::kGoAway, 0, 0}.AppendTo(out);
  AppendBigEndian(last_stream_id & 0x7fffffffu, 4, out);
  AppendBigEndian(static_cast<uint32_t>(code), 4, out);
  out.append(debug);
}

void AppendRstStream(uint32_t stream_id, ErrorCode code, std::string& out) {
  FrameHeader{4, FrameType::kRstStream, 0, stream_id}.AppendTo(out);
  AppendBigEndian(static_cast<uint32_t>(code), 4, out);
}

void AppendWindowUpdate(uint32_t stream_id, uint32_t increment, std::string& out) {
  FrameHeader{4, FrameType::kWindowUpdate, 0, stream_id}.AppendTo(out);
  AppendBigEndian(increment & 0x7fffffffu, 4, out);
}

void AppendGrpcStatus(uint32_t stream_id, bool trailers_only, int grpc_status,
                      std::string_view message, std::string& out) {
  std::string block;
  if (trailers_only) {
    block.push_back(static_cast<char>(0x88));  // indexed: static entry 8, ":status: 200"
    AppendLiteralIndexedName(31, "application/grpc", block);  // static entry 31: content-type
  }
  AppendLiteralNewName("grpc-status", absl::StrCat(grpc_status), block);
  AppendLiteralNewName("grpc-message", PercentEncode(message), block);
  FrameHeader{static_cast<uint32_t>(block.size()), FrameType::kHeaders,
              kFlagEndStream | kFlagEndHeaders, stream_id}
      .AppendTo(out);
  out.append(block);
}

}  // namespace mlaserve::listener
