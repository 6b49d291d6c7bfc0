// The UCX data plane's messages as a hostile client sends them: the input's first byte is the
// active message header's length (its bytes follow; a call's header is its 8-byte id), the
// rest the message's data. The data is parsed as a hello (UcxHello) and as a call
// (ParseUcxCall: the DataPlaneCall, the header's id against its own, the inline packed
// request); a call that passes runs through the fuzz engine's dispatcher, and every outcome
// is written as the DataPlaneAnswer the plane would send. Nothing may crash or leak.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "common/ucx_wire.h"
#include "mlaserve/v1/data_plane.pb.h"
#include "server/dataplane/ucx_call.h"
#include "tests/fuzz/fuzz_engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t header_length = std::min<size_t>(data[0], size - 1);
  const uint8_t* header = data + 1;
  const uint8_t* body = header + header_length;
  const size_t body_length = size - 1 - header_length;
  mlaserve::v1::UcxHello hello;
  (void)hello.ParseFromArray(body, static_cast<int>(body_length));
  mlaserve::fuzz::FuzzEngine& fixture = mlaserve::fuzz::FuzzEngine::Get();
  const uint64_t call_id = mlaserve::ucx::ReadCallId(header, header_length).value_or(0);
  absl::StatusOr<mlaserve::dataplane::UcxCall> call = mlaserve::dataplane::ParseUcxCall(
      call_id, body, body_length, std::make_shared<mlaserve::v1::DataPlaneCall>());
  std::string answer;
  size_t answer_bytes = 0;
  if (!call.ok()) {
    (void)mlaserve::dataplane::WriteUcxAnswer(call_id, call.status(), answer, &answer_bytes);
    return 0;
  }
  bool appended = false;
  for (const auto& query : call->call->queries) appended |= !query.append_rows.empty();
  std::promise<void> answered;
  fixture.dispatcher().Dispatch(
      std::move(call->call), nullptr, absl::Now() + absl::Seconds(30), [] { return false; },
      [&](absl::StatusOr<mlaserve::service::AnsweredDecode> answers) {
        (void)mlaserve::dataplane::WriteUcxAnswer(call_id, answers, answer, &answer_bytes);
        answered.set_value();
      });
  answered.get_future().get();
  if (appended) fixture.Reset();
  return 0;
}
