// AppendKv chunks, bf16 rows or FP8 records, against the fixture's bf16 sequence "s" and
// FP8 sequence "f" (and any id a chunk names): the wire decoding, the record checks and the
// KV store's append.

#include <cstddef>
#include <cstdint>

#include "mlaserve/v1/kv_cache.pb.h"
#include "server/service/kv_requests.h"
#include "tests/fuzz/fuzz_engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mlaserve::v1::AppendKvChunk chunk;
  if (!chunk.ParseFromArray(data, static_cast<int>(size))) return 0;
  mlaserve::fuzz::FuzzEngine& fixture = mlaserve::fuzz::FuzzEngine::Get();
  const absl::StatusOr<int64_t> rows =
      mlaserve::service::ApplyAppendChunk(fixture.engine(), chunk, "chunks[0]");
  if (rows.ok()) fixture.Reset();
  return 0;
}
