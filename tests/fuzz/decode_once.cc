#include "tests/fuzz/decode_once.h"

#include <algorithm>
#include <future>

#include "absl/time/clock.h"
#include "tests/fuzz/fuzz_engine.h"

namespace mlaserve::fuzz {

void DecodeOnce(v1::DecodeRequest request, uint64_t timeout_us) {
  FuzzEngine& fixture = FuzzEngine::Get();
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  if (timeout_us > 0) {
    deadline = std::min(deadline, absl::Now() + absl::Microseconds(static_cast<int64_t>(
                                                    std::min<uint64_t>(timeout_us, 30000000))));
  }
  v1::DecodeResponse response;
  std::promise<absl::Status> answered;
  fixture.dispatcher().Dispatch(
      request, /*tenant=*/nullptr, deadline, [] { return false; }, &response,
      [&answered](absl::Status status) { answered.set_value(std::move(status)); });
  answered.get_future().get().IgnoreError();  // any status is a fine answer to a fuzzed request
  bool appended = false;
  for (const v1::DecodeQuery& query : request.queries()) appended |= query.has_append_rows();
  if (appended) fixture.Reset();
}

}  // namespace mlaserve::fuzz
