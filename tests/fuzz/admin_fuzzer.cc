// The read-only admin RPCs (admin.proto) as a client may send them: the first byte picks
// ListPrefixes, ListSequences or GetStats, the rest is the request. Drives the page size,
// page token and prefix filter validation and the KV store's listings on the small model
// (the fixture's prefix "p" and sequences "s" and "f"), and checks what every answer must
// hold whatever the request: no more entries than the page size allows, and a next-page
// token only past entries that were listed.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "mlaserve/v1/admin.pb.h"
#include "server/service/admin_requests.h"
#include "tests/fuzz/fuzz_engine.h"

namespace {

// The answer violated the RPC's contract: a bug, so stop as a crash would.
void Require(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "admin_fuzzer: %s\n", what);
    std::abort();
  }
}

int PageLimit(int32_t page_size) { return page_size == 0 ? 100 : page_size; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const mlaserve::engine::Engine& engine = mlaserve::fuzz::FuzzEngine::Get().engine();
  const uint8_t rpc = data[0] % 3;
  ++data;
  --size;
  if (rpc == 0) {
    mlaserve::v1::ListPrefixesRequest request;
    if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
    mlaserve::v1::ListPrefixesResponse response;
    const absl::Status status =
        mlaserve::service::ListPrefixesOnEngine(engine, nullptr, request, &response);
    if (status.ok()) {
      Require(response.prefixes_size() <= PageLimit(request.page_size()), "page over its size");
      Require(response.next_page_token().empty() || response.prefixes_size() > 0,
              "a next page token after an empty page");
    } else {
      Require(status.code() == absl::StatusCode::kInvalidArgument, "not INVALID_ARGUMENT");
    }
  } else if (rpc == 1) {
    mlaserve::v1::ListSequencesRequest request;
    if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
    mlaserve::v1::ListSequencesResponse response;
    const absl::Status status =
        mlaserve::service::ListSequencesOnEngine(engine, nullptr, request, &response);
    if (status.ok()) {
      Require(response.sequences_size() <= PageLimit(request.page_size()), "page over its size");
      Require(response.next_page_token().empty() || response.sequences_size() > 0,
              "a next page token after an empty page");
    } else {
      Require(status.code() == absl::StatusCode::kInvalidArgument, "not INVALID_ARGUMENT");
    }
  } else {
    mlaserve::v1::GetStatsRequest request;
    if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
    mlaserve::v1::GetStatsResponse response;
    Require(mlaserve::service::GetStatsOnEngine(engine, nullptr, nullptr, &response).ok(),
            "GetStats failed");
    Require(response.kv_pages_used() <= response.kv_pages_total(), "more pages used than exist");
  }
  return 0;
}
