#include "server/service/decode_dispatcher.h"

#include <memory>
#include <utility>
#include <vector>

#include "server/service/decode_codec.h"

namespace mlaserve::service {

void DecodeDispatcher::Dispatch(const v1::DecodeRequest& request, absl::Time deadline,
                                std::function<bool()> cancelled, v1::DecodeResponse* response,
                                Done done) {
  absl::StatusOr<std::unique_ptr<ParsedDecode>> parsed = ParseDecodeRequest(request);
  if (!parsed.ok()) {
    std::move(done)(parsed.status());
    return;
  }
  // The engine gets views of the request's bytes; the parsed call (views, converted inputs)
  // lives in the callback until the answers are encoded.
  std::vector<engine::DecodeQuery> queries = (*parsed)->queries;
  engine::DecodeOptions options;
  options.deadline = deadline;
  options.cancelled = std::move(cancelled);
  engine_.Decode(std::move(queries), std::move(options),
                 [this, call = *std::move(parsed), response, done = std::move(done)](
                     absl::StatusOr<std::span<const engine::DecodeAnswer>> answers) mutable {
                   if (!answers.ok()) {
                     std::move(done)(answers.status());
                     return;
                   }
                   absl::Status filled = FillDecodeResponse(call->queries, engine_.Info().model,
                                                            call->output_dtype, *answers, response);
                   if (filled.ok()) {
                     for (size_t i = 0; i < answers->size(); ++i) {
                       metrics_.RecordDecodeAnswer((*answers)[i].plan, call->queries[i].space);
                     }
                   } else {
                     response->Clear();
                   }
                   std::move(done)(std::move(filled));
                 });
}

}  // namespace mlaserve::service
