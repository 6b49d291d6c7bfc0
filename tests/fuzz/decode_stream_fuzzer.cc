// DecodeStream messages: the request id and per-request timeout around a Decode request,
// through the same dispatcher as the stream reactor.

#include <cstddef>
#include <cstdint>

#include "mlaserve/v1/decode.pb.h"
#include "tests/fuzz/decode_once.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mlaserve::v1::DecodeStreamRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  mlaserve::fuzz::DecodeOnce(request.request(), request.timeout_us());
  return 0;
}
