// RegisterPrefix requests: the latent's wire decoding, the format, the parent chain and the
// KV store's registration on the small model.

#include <cstddef>
#include <cstdint>

#include "mlaserve/v1/kv_cache.pb.h"
#include "server/service/kv_requests.h"
#include "tests/fuzz/fuzz_engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mlaserve::v1::RegisterPrefixRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  mlaserve::fuzz::FuzzEngine& fixture = mlaserve::fuzz::FuzzEngine::Get();
  const absl::Status status = mlaserve::service::RegisterPrefixOnEngine(fixture.engine(), request);
  if (status.ok() && request.prefix_id() != "p") {
    fixture.engine().ReleasePrefix(request.prefix_id()).IgnoreError();
  }
  return 0;
}
