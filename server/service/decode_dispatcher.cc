#include "server/service/decode_dispatcher.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/service/tenant_scope.h"

namespace mlaserve::service {
namespace {

// Every status a call answers with: without the tenant's namespace, in the call's own fields.
absl::Status ForCaller(Tenant* tenant, DecodeForm form, const absl::Status& status) {
  absl::Status unscoped = UnscopeStatus(tenant, status);
  return form == DecodeForm::kPacked ? NamePackedFields(unscoped) : unscoped;
}

}  // namespace

void DecodeDispatcher::Dispatch(std::unique_ptr<ParsedDecode> call, Tenant* tenant,
                                absl::Time deadline, std::function<bool()> cancelled,
                                Answered answered) {
  const DecodeForm form = call->form;
  if (absl::Status scoped = ScopeIds(tenant, *call); !scoped.ok()) {
    std::move(answered)(ForCaller(tenant, form, scoped));
    return;
  }
  for (size_t i = 0; i < call->queries.size(); ++i) {
    if (absl::Status moved = moved_.Check(call->queries[i].sequence_id,
                                          absl::StrCat("queries[", i, "].sequence_id"));
        !moved.ok()) {
      std::move(answered)(ForCaller(tenant, form, moved));
      return;
    }
  }
  const int64_t queued = static_cast<int64_t>(call->queries.size());
  if (tenant != nullptr) {
    if (!tenant->TryQueue(queued)) {
      tenant->queue_refusals.fetch_add(1, std::memory_order_relaxed);
      std::move(answered)(absl::UnavailableError(
          absl::StrCat("tenant '", tenant->name, "' has ", tenant->queued_queries.load(),
                       " queries queued or running, its share of the queue is ",
                       tenant->max_queued_queries, "; retry after its answers")));
      return;
    }
    tenant->decode_queries.fetch_add(queued, std::memory_order_relaxed);
  }
  // The engine gets views of the call's bytes; the call (views, converted inputs) lives in
  // the callback until the answers are encoded.
  std::vector<engine::DecodeQuery> queries = call->queries;
  engine::DecodeOptions options;
  options.deadline = deadline;
  options.cancelled = std::move(cancelled);
  options.softmax_scale = call->softmax_scale;
  options.batch_invariant = call->batch_invariant;
  engine_.Decode(
      std::move(queries), std::move(options),
      [this, tenant, queued, call = std::move(call), answered = std::move(answered)](
          absl::StatusOr<std::span<const engine::DecodeAnswer>> answers) mutable {
        // Its share is back when the answers are, however the call ends.
        if (tenant != nullptr) tenant->Unqueue(queued);
        if (!answers.ok()) {
          std::move(answered)(ForCaller(tenant, call->form, answers.status()));
          return;
        }
        for (size_t i = 0; i < answers->size(); ++i) {
          metrics_.RecordDecodeAnswer((*answers)[i].plan, call->queries[i].space);
        }
        std::move(answered)(AnsweredDecode{call.get(), *answers, &engine_.Info().model, tenant});
      });
}

}  // namespace mlaserve::service
