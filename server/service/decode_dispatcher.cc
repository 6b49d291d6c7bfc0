#include "server/service/decode_dispatcher.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/service/decode_codec.h"

namespace mlaserve::service {

void DecodeDispatcher::Dispatch(const v1::DecodeRequest& request, absl::Time deadline,
                                std::function<bool()> cancelled, v1::DecodeResponse* response,
                                Done done) {
  absl::StatusOr<ParsedDecode> parsed = ParseDecodeRequest(request, engine_.Info());
  if (!parsed.ok()) {
    std::move(done)(parsed.status());
    return;
  }
  std::vector<engine::QuerySpace> spaces;
  spaces.reserve(parsed->queries.size());
  for (const engine::DecodeQuery& query : parsed->queries) spaces.push_back(query.space);

  engine::DecodeOptions options;
  options.deadline = deadline;
  options.cancelled = std::move(cancelled);
  engine_.Decode(
      std::move(parsed->queries), std::move(options),
      [this, layouts = std::move(parsed->layouts),
       output_dtype = parsed->output_dtype, spaces = std::move(spaces), response,
       done = std::move(done)](
          absl::StatusOr<std::vector<engine::DecodeAnswer>> answers) mutable {
        if (!answers.ok()) {
          std::move(done)(answers.status());
          return;
        }
        absl::Status filled = FillDecodeResponse(layouts, output_dtype, *answers, response);
        if (filled.ok()) {
          for (std::size_t i = 0; i < answers->size(); ++i) {
            metrics_.RecordDecodeAnswer((*answers)[i].plan, spaces[i]);
          }
        } else {
          response->Clear();
        }
        std::move(done)(std::move(filled));
      });
}

}  // namespace mlaserve::service
