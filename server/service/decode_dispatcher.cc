#include "server/service/decode_dispatcher.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/service/decode_codec.h"
#include "server/service/tenant_scope.h"

namespace mlaserve::service {

void DecodeDispatcher::Dispatch(v1::DecodeRequest& request, Tenant* tenant, absl::Time deadline,
                                std::function<bool()> cancelled, v1::DecodeResponse* response,
                                Done done) {
  if (absl::Status scoped = ScopeIds(tenant, request); !scoped.ok()) {
    std::move(done)(scoped);
    return;
  }
  for (int i = 0; i < request.queries_size(); ++i) {
    if (absl::Status moved = moved_.Check(request.queries(i).sequence_id(),
                                          absl::StrCat("queries[", i, "].sequence_id"));
        !moved.ok()) {
      std::move(done)(moved);
      return;
    }
  }
  absl::StatusOr<std::unique_ptr<ParsedDecode>> parsed = ParseDecodeRequest(request);
  if (!parsed.ok()) {
    std::move(done)(UnscopeStatus(tenant, parsed.status()));
    return;
  }
  const int64_t queued = request.queries_size();
  if (tenant != nullptr) {
    if (!tenant->TryQueue(queued)) {
      tenant->queue_refusals.fetch_add(1, std::memory_order_relaxed);
      std::move(done)(absl::UnavailableError(
          absl::StrCat("tenant '", tenant->name, "' has ", tenant->queued_queries.load(),
                       " queries queued or running, its share of the queue is ",
                       tenant->max_queued_queries, "; retry after its answers")));
      return;
    }
    tenant->decode_queries.fetch_add(queued, std::memory_order_relaxed);
    // Its share is back when the answers are, however the call ends.
    done = [tenant, queued, response, done = std::move(done)](absl::Status status) mutable {
      tenant->Unqueue(queued);
      if (status.ok()) UnscopeIds(tenant, *response);
      std::move(done)(UnscopeStatus(tenant, status));
    };
  }
  // The engine gets views of the request's bytes; the parsed call (views, converted inputs)
  // lives in the callback until the answers are encoded.
  std::vector<engine::DecodeQuery> queries = (*parsed)->queries;
  engine::DecodeOptions options;
  options.deadline = deadline;
  options.cancelled = std::move(cancelled);
  options.softmax_scale = (*parsed)->softmax_scale;
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
