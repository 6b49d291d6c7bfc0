#include "tests/fuzz/decode_once.h"

#include <algorithm>
#include <future>

#include "absl/time/clock.h"
#include "server/service/decode_answers.h"
#include "server/service/decode_codec.h"
#include "tests/fuzz/fuzz_engine.h"

namespace mlaserve::fuzz {

void DecodeOnce(v1::DecodeRequest request, uint64_t timeout_us) {
  FuzzEngine& fixture = FuzzEngine::Get();
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  if (timeout_us > 0) {
    deadline = std::min(deadline, absl::Now() + absl::Microseconds(static_cast<int64_t>(
                                                    std::min<uint64_t>(timeout_us, 30000000))));
  }
  absl::StatusOr<std::unique_ptr<service::ParsedDecode>> call =
      service::ParseDecodeRequest(request);
  if (call.ok()) {
    std::promise<void> answered;
    fixture.dispatcher().Dispatch(
        *std::move(call), /*tenant=*/nullptr, deadline, [] { return false; },
        [&answered](absl::StatusOr<service::AnsweredDecode> answers) {
          // Any status is a fine answer to a fuzzed request; answers must encode.
          if (answers.ok()) service::WriteDecodeResponse(*answers).IgnoreError();
          answered.set_value();
        });
    answered.get_future().get();
  }
  bool appended = false;
  for (const v1::DecodeQuery& query : request.queries()) appended |= query.has_append_rows();
  appended |= request.packed().has_append_rows();
  if (appended) fixture.Reset();
}

}  // namespace mlaserve::fuzz
