#include "server/dataplane/ucx_call.h"

#include <algorithm>
#include <climits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace mlaserve::dataplane {
namespace {

constexpr uint32_t kResponseField = 2;  // DataPlaneAnswer.response, length-delimited

void SetAnswerStatus(const absl::Status& status, v1::RequestStatus* wire) {
  wire->set_code(static_cast<int>(status.code()));
  wire->set_message(std::string(status.message()));
}

}  // namespace

absl::StatusOr<UcxCall> ParseUcxCall(uint64_t header_id, const void* data, size_t length,
                                     std::shared_ptr<v1::DataPlaneCall> message) {
  if (length > static_cast<size_t>(INT_MAX) ||
      !message->ParseFromArray(data, static_cast<int>(length))) {
    return absl::InvalidArgumentError(
        absl::StrCat("call: ", length, " bytes that are not a DataPlaneCall"));
  }
  if (message->call_id() != 0 && message->call_id() != header_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("call_id: ", message->call_id(), " differs from the header's ", header_id));
  }
  for (const auto field : {&v1::DataPlaneCall::out_offset, &v1::DataPlaneCall::out_bytes,
                           &v1::DataPlaneCall::lse_offset, &v1::DataPlaneCall::lse_bytes}) {
    if (((*message).*field)() != 0) {
      return absl::InvalidArgumentError(
          "out_offset: answer areas are the shared-memory plane's; over UCX the answers come "
          "back inline");
    }
  }
  UcxCall parsed;
  absl::StatusOr<std::unique_ptr<service::ParsedDecode>> call =
      service::ParseDecodeRequest(message->request());
  if (!call.ok()) {
    return absl::Status(call.status().code(), absl::StrCat("request.", call.status().message()));
  }
  parsed.call = *std::move(call);
  if (message->timeout_us() > 0) {
    parsed.deadline = absl::Now() + absl::Microseconds(static_cast<int64_t>(
                                        std::min<uint64_t>(message->timeout_us(), INT64_MAX / 2)));
  }
  parsed.call->keep_alive = std::move(message);
  return parsed;
}

absl::Status WriteUcxAnswer(uint64_t call_id,
                            const absl::StatusOr<service::AnsweredDecode>& answered,
                            std::string& into, size_t* size) {
  absl::Status status = answered.status();
  std::optional<grpc::ByteBuffer> response;
  if (status.ok()) {
    absl::StatusOr<grpc::ByteBuffer> written = service::WriteDecodeResponse(*answered);
    status = written.status();
    if (written.ok()) response = *std::move(written);
  }
  v1::DataPlaneAnswer head;
  SetAnswerStatus(status, head.mutable_status());
  head.set_call_id(call_id);
  const std::string head_bytes = head.SerializeAsString();
  // The response's bytes as field 2 after the head (fields may come in any order): the
  // answers were encoded once into gRPC's buffer, and are copied once here, not re-serialised.
  std::vector<grpc::Slice> slices;
  uint8_t prefix[16];
  size_t prefix_bytes = 0;
  size_t response_bytes = 0;
  if (response.has_value()) {
    (void)response->Dump(&slices);
    response_bytes = response->Length();
    uint8_t* end =
        google::protobuf::io::CodedOutputStream::WriteTagToArray((kResponseField << 3) | 2, prefix);
    end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(response_bytes, end);
    prefix_bytes = static_cast<size_t>(end - prefix);
  }
  *size = head_bytes.size() + prefix_bytes + response_bytes;
  if (into.size() < *size) into.resize(*size);
  char* at = std::copy(head_bytes.begin(), head_bytes.end(), into.data());
  at = std::copy(prefix, prefix + prefix_bytes, at);
  for (const grpc::Slice& slice : slices) {
    at = std::copy(slice.begin(), slice.end(), at);
  }
  return status;
}

}  // namespace mlaserve::dataplane
