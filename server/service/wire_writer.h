#ifndef MLASERVE_SERVER_SERVICE_WIRE_WRITER_H_
#define MLASERVE_SERVER_SERVICE_WIRE_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace mlaserve::service {

// Protocol-buffer wire format written by hand into memory sized beforehand, for the answers'
// large messages: a tensor's bytes are encoded straight into the message instead of into a
// message object that protobuf then copies out. Only what those messages need: varints and
// length-delimited fields (protobuf's encoding guide, "Message Structure").
class WireWriter {
 public:
  enum WireType : uint32_t { kVarint = 0, kLengthDelimited = 2 };

  explicit WireWriter(uint8_t* at) : at_(at) {}

  static size_t VarintSize(uint64_t value) {
    size_t size = 1;
    while (value >= 0x80) {
      value >>= 7;
      ++size;
    }
    return size;
  }
  static size_t TagSize(int field) { return VarintSize(static_cast<uint64_t>(field) << 3); }
  static size_t VarintFieldSize(int field, uint64_t value) {
    return TagSize(field) + VarintSize(value);
  }
  // A length-delimited field with `payload` bytes, header included.
  static size_t LengthDelimitedSize(int field, size_t payload) {
    return TagSize(field) + VarintSize(payload) + payload;
  }
  // A packed repeated varint field's payload.
  static size_t PackedVarintsSize(std::span<const int64_t> values) {
    size_t size = 0;
    for (int64_t value : values) size += VarintSize(static_cast<uint64_t>(value));
    return size;
  }

  void Varint(uint64_t value) {
    while (value >= 0x80) {
      *at_++ = static_cast<uint8_t>(value | 0x80);
      value >>= 7;
    }
    *at_++ = static_cast<uint8_t>(value);
  }
  void Tag(int field, WireType type) { Varint((static_cast<uint64_t>(field) << 3) | type); }
  void VarintField(int field, uint64_t value) {
    Tag(field, kVarint);
    Varint(value);
  }
  // The header of a length-delimited field; its `payload` bytes follow.
  void LengthDelimited(int field, size_t payload) {
    Tag(field, kLengthDelimited);
    Varint(payload);
  }
  void PackedVarints(int field, std::span<const int64_t> values) {
    if (values.empty()) return;
    LengthDelimited(field, PackedVarintsSize(values));
    for (int64_t value : values) Varint(static_cast<uint64_t>(value));
  }
  // `size` bytes to be filled by the caller.
  uint8_t* Skip(size_t size) {
    uint8_t* start = at_;
    at_ += size;
    return start;
  }
  void Bytes(const void* data, size_t size) {
    if (size > 0) std::memcpy(Skip(size), data, size);
  }
  uint8_t* at() const { return at_; }

 private:
  uint8_t* at_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_WIRE_WRITER_H_
