#ifndef MLASERVE_SERVER_SERVICE_KV_REQUESTS_H_
#define MLASERVE_SERVER_SERVICE_KV_REQUESTS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mlaserve/v1/kv_cache.pb.h"
#include "server/engine/engine.h"

namespace mlaserve::service {

// The KV requests' work on the engine, each as one function from the wire message to the
// engine's status, shared by the service's handlers and the fuzzers (tests/fuzz/), so that
// both run exactly the same decoding and checks.

// RegisterPrefix: the latent decoded and checked, then registered in the format asked.
absl::Status RegisterPrefixOnEngine(engine::Engine& engine,
                                    const v1::RegisterPrefixRequest& request);

// One AppendKv chunk (bf16 rows or FP8 records); errors prefixed with `field`
// ("chunks[i]"). Returns the rows appended.
absl::StatusOr<int64_t> ApplyAppendChunk(engine::Engine& engine, const v1::AppendKvChunk& chunk,
                                         absl::string_view field);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_KV_REQUESTS_H_
