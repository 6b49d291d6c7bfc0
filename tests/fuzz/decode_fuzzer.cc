// Decode requests as a client may send them: the wire decoding (ParseDecodeRequest), the
// engine's validation, and, for requests that pass, the batcher, planner and host kernels on
// the small model, through the same dispatcher the service uses.

#include <cstddef>
#include <cstdint>

#include "mlaserve/v1/decode.pb.h"
#include "tests/fuzz/decode_once.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mlaserve::v1::DecodeRequest request;
  // A message that does not parse ends at ParseWireMessage (INVALID_ARGUMENT).
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  mlaserve::fuzz::DecodeOnce(request);
  return 0;
}
