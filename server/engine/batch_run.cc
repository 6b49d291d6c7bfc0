#include "server/engine/batch_run.h"

#include <chrono>
#include <cmath>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/mla/batch_step_builder.h"
#include "server/engine/plan/decode_batch_lowering.h"

namespace mlaserve::engine {
namespace {

// Status a call gets when abandoned at a checkpoint, or OK to go on.
absl::Status Checkpoint(const PendingCall& call, absl::string_view where) {
  if (call.options.cancelled && call.options.cancelled()) {
    return absl::CancelledError(absl::StrCat("cancelled by the client ", where));
  }
  if (absl::Now() > call.options.deadline) {
    return absl::DeadlineExceededError(absl::StrCat("deadline passed ", where));
  }
  return absl::OkStatus();
}

// A call's appends, in query order; the first failure fails the call (those before it stay
// applied, and a retry skips them: appends are idempotent by position).
absl::Status ApplyAppends(const PendingCall& call, KvStore& store) {
  for (size_t i = 0; i < call.queries.size(); ++i) {
    const DecodeQuery& q = call.queries[i];
    if (q.append_rows.empty()) continue;
    const absl::Status status =
        store.Append(q.sequence_id, q.layer, q.append_position, q.append_rows);
    if (!status.ok())
      return absl::Status(status.code(),
                          absl::StrCat("queries[", i, "] append: ", status.message()));
  }
  return absl::OkStatus();
}

// OK unless a token that saw keys got no finite LSE: its scores overflowed fp32 (finite bf16
// inputs can: two elements near 1e20 multiply past fp32's range), and the kernels' answer
// would read as "saw no key" (out 0, lse -inf), a silent wrong answer. Token t of sq sees
// the first length - sq + t + 1 keys.
absl::Status CheckScoresStayedFinite(std::span<const float> lse, int sq, int heads,
                                     int32_t length) {
  for (int t = 0; t < sq; ++t) {
    if (length - sq + t + 1 <= 0) continue;
    for (int h = 0; h < heads; ++h) {
      if (std::isfinite(lse[static_cast<size_t>(t) * heads + h])) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", t, " head ", h,
          ": attention scores overflow fp32 (|q.k| x softmax scale beyond 3.4e38); the query's "
          "or the KV's magnitudes are far outside a model's range"));
    }
  }
  return absl::OkStatus();
}

double Microseconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

}  // namespace

BatchRun::BatchRun(std::vector<PendingCall> calls, BatchContext& context)
    : context_(context),
      calls_(std::move(calls)),
      call_status_(calls_.size()),
      answered_(calls_.size(), 0),
      key_(calls_.empty() ? BatchKey{} : calls_.front().key) {}

BatchRun::~BatchRun() {
  for (size_t c = 0; c < calls_.size(); ++c) {
    if (!answered_[c])
      Answer(c, absl::UnavailableError("the engine stopped before running the batch"));
  }
}

std::unique_ptr<BatchRun> BatchRun::Start(std::vector<PendingCall> calls, BatchContext& context) {
  std::vector<PendingCall> live;
  for (PendingCall& call : calls) {
    absl::Status status = Checkpoint(call, "before device work");
    if (status.ok()) status = ApplyAppends(call, context.store);
    if (status.ok()) {
      live.push_back(std::move(call));
      continue;
    }
    std::move(call.done)(status);
    context.call_answered();
  }
  if (live.empty()) return nullptr;
  std::unique_ptr<BatchRun> run(new BatchRun(std::move(live), context));
  run->Plan();
  return run;
}

void BatchRun::Plan() {
  std::vector<const DecodeQuery*> batch;  // by batch index
  for (int c = 0; c < static_cast<int>(calls_.size()); ++c) {
    for (int i = 0; i < static_cast<int>(calls_[c].queries.size()); ++i) {
      batch.push_back(&calls_[c].queries[i]);
      origin_.emplace_back(c, i);
    }
  }
  Planner::Result planned = context_.planner.Plan(context_.store, batch, key_.batch_invariant);
  for (const auto& [index, status] : planned.failed) {
    const auto [c, i] = origin_[index];
    call_status_[c] =
        absl::Status(status.code(), absl::StrCat("queries[", i, "]: ", status.message()));
  }
  plan_ = std::make_unique<BatchPlan>(std::move(planned.plan));
  context_.counters.batches.fetch_add(1);
  context_.counters.queries.fetch_add(queries());
}

void BatchRun::Answer(size_t call, absl::StatusOr<std::span<const DecodeAnswer>> result) {
  answered_[call] = 1;
  std::move(calls_[call].done)(std::move(result));
  context_.call_answered();
}

void BatchRun::Execute(AttentionDevice& device, int device_index) {
  const auto start = std::chrono::steady_clock::now();
  const absl::Time device_start = absl::Now();

  // Prepare: the passes' expansions (matrix work, here rather than on the batcher's thread),
  // then the plan as the kernels' steps.
  context_.planner.PrepareExpansions(*plan_, context_.store, context_.weights);
  absl::StatusOr<BuiltBatch> built =
      BuildBatchSteps(ToDecodeBatch(*plan_, context_.weights, key_, context_.device));
  const auto prepared = std::chrono::steady_clock::now();

  // Run.
  absl::StatusOr<DeviceRun> run =
      built.ok() ? device.Run(built->steps) : absl::StatusOr<DeviceRun>(built.status());
  const double host_ms = Microseconds(std::chrono::steady_clock::now() - prepared) / 1000;

  // Complete.
  int hybrid = 0, absorb = 0;
  for (const GroupPlan& group : plan_->groups)
    (group.formulation == Formulation::kHybrid ? hybrid : absorb) += 1;
  BatchReport report;
  report.device = device_index;
  report.queries = queries();
  report.hybrid_groups = hybrid;
  report.absorb_groups = absorb;
  report.status = run.status();
  if (run.ok()) {
    report.modeled_us = run->modeled_us;
    report.host_ms = host_ms;
    report.device_us = run->device_us;
    report.bytes_to_device = run->bytes_to_device;
    report.kv_bytes_to_device = run->kv_bytes_to_device;
    report.query_bytes_in_place = run->query_bytes_in_place;
  }
  context_.counters.hybrid_groups.fetch_add(hybrid);
  context_.counters.absorb_groups.fetch_add(absorb);
  if (context_.on_batch) context_.on_batch(report);

  std::vector<std::vector<DecodeAnswer>> answers(calls_.size());
  for (size_t c = 0; c < calls_.size(); ++c) answers[c].resize(calls_[c].queries.size());
  if (run.ok()) {
    const double prepare_us = Microseconds(prepared - start);
    for (size_t g = 0; g < plan_->groups.size(); ++g) {
      const GroupPlan& group = plan_->groups[g];
      const int root_tokens =
          group.naive_passes.empty() ? 0 : plan_->passes[group.naive_passes.front()].query_tokens;
      for (size_t m = 0; m < group.members.size(); ++m) {
        const auto [c, i] = origin_[group.members[m]];
        const AnswerRef& ref = built->answers[g][m];
        DecodeAnswer& answer = answers[c][i];
        answer.out_type = ref.out_type;
        answer.out = run->buffers->Bytes(ref.out.buffer).data() +
                     ref.out.offset * ElementBytes(ref.out_type);
        answer.out_elements = ref.out_elements;
        answer.lse = run->buffers->Elements<float>(ref.lse, ref.lse_elements);
        const PlannedQuery& planned = plan_->queries[group.members[m]];
        if (absl::Status finite = CheckScoresStayedFinite(answer.lse, group.sq, key_.heads,
                                                          plan_->sequence(planned).length);
            !finite.ok() && call_status_[c].ok()) {
          call_status_[c] =
              absl::InvalidArgumentError(absl::StrCat("queries[", i, "]: ", finite.message()));
        }
        answer.plan = PlanInfo{group.formulation,
                               group.prefix_id,
                               static_cast<int>(group.members.size()),
                               group.b_theta,
                               group.absorb_from,
                               root_tokens,
                               group.kv_dtype,
                               device_index,
                               queries(),
                               absl::ToDoubleMicroseconds(device_start - calls_[c].submitted),
                               prepare_us,
                               run->modeled_us,
                               host_ms};
      }
    }
  }
  plan_.reset();  // unpin before answering: a caller may release what it read
  for (size_t c = 0; c < calls_.size(); ++c) {
    absl::Status status = run.ok() ? call_status_[c] : run.status();
    if (status.ok()) status = Checkpoint(calls_[c], "after device work");
    if (status.ok()) {
      Answer(c, std::span<const DecodeAnswer>(answers[c]));
    } else {
      Answer(c, status);
    }
  }
}

}  // namespace mlaserve::engine
