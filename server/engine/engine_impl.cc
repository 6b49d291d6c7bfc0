#include "server/engine/engine_impl.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/devices/host_attention_device.h"
#include "server/engine/devices/npu_attention_device.h"

namespace mlaserve::engine {
namespace {

bool AllFinite(const std::vector<Bf16>& values) {
  for (Bf16 v : values) {
    if (!v.IsFinite()) return false;
  }
  return true;
}

absl::Status CheckSize(const std::vector<Bf16>& values, int64_t expected, int index,
                       absl::string_view field) {
  if (static_cast<int64_t>(values.size()) == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("queries[", index, "].", field, " has ",
                                                 values.size(), " values, expected ", expected));
}

}  // namespace

absl::StatusOr<std::unique_ptr<EngineImpl>> EngineImpl::Create(
    EngineOptions options, std::vector<std::unique_ptr<AttentionDevice>> devices) {
  RETURN_IF_ERROR(options.model.Validate());
  if (options.max_batch < 1 || options.max_queue < options.max_batch || options.max_sq < 1) {
    return absl::InvalidArgumentError(
        "engine options: need max_batch >= 1, max_queue >= max_batch and max_sq >= 1");
  }
  if (options.preload < 0 || options.preload > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine options: preload = ", options.preload, " is not 0, 1 or 2"));
  }
  if (devices.empty()) {
    if (options.devices < 1) return absl::InvalidArgumentError("engine options: devices must be >= 1");
    if (options.profile == "host") {
      for (int i = 0; i < options.devices; ++i) devices.push_back(std::make_unique<HostAttentionDevice>());
    } else {
      absl::StatusOr<npu::DeviceProfile> profile = npu::LoadDeviceProfile(options.profile);
      if (!profile.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("engine options: profile '", options.profile,
                                                       "': ", profile.status().message()));
      }
      for (int i = 0; i < options.devices; ++i) {
        ASSIGN_OR_RETURN(auto device,
                         NpuAttentionDevice::Create(*profile, {.host_threads = options.host_threads_per_device},
                                                    {.preload = options.preload}));
        devices.push_back(std::move(device));
      }
    }
  }
  // The threshold uses the first device's rates unless overridden (a pool is homogeneous in
  // practice; with mixed devices the planner would need per-device thresholds).
  DeviceRates rates;
  const DeviceInfo& first = devices.front()->info();
  rates.matrix_flops = (options.matrix_tflops > 0 ? options.matrix_tflops : first.matrix_tflops) * 1e12;
  rates.memory_bytes_per_second = (options.hbm_tbps > 0 ? options.hbm_tbps : first.hbm_tbps) * 1e12;
  if (!(rates.matrix_flops > 0) || !(rates.memory_bytes_per_second > 0)) {
    // A device without a roofline (the host) gives no threshold: B_theta is infinite, every
    // group runs absorb-only, unless both rates are overridden.
    rates = DeviceRates{std::numeric_limits<double>::infinity(), 1.0};
  }
  absl::StatusOr<ModelWeights> weights =
      options.weights.safetensors_path.empty()
          ? ModelWeights::FromSeed(options.model, options.weights.seed)
          : ModelWeights::FromSafetensors(options.model, options.weights.safetensors_path);
  if (!weights.ok()) return weights.status();
  ASSIGN_OR_RETURN(auto store, KvStore::Create(options.model, options.kv));
  return std::unique_ptr<EngineImpl>(new EngineImpl(std::move(options), *std::move(weights),
                                                    std::move(store), rates, std::move(devices)));
}

EngineImpl::EngineImpl(EngineOptions options, ModelWeights weights, std::unique_ptr<KvStore> store,
                       DeviceRates rates, std::vector<std::unique_ptr<AttentionDevice>> devices)
    : options_(std::move(options)),
      weights_(std::move(weights)),
      store_(std::move(store)),
      planner_(options_.model, rates, options_.max_sq) {
  info_.model = options_.model;
  info_.page_size = store_->page_size();
  for (const auto& device : devices) info_.devices.push_back(device->info());
  info_.b_theta_by_sq = planner_.BThetaBySq();
  info_.max_batch = options_.max_batch;
  info_.max_sq = options_.max_sq;
  info_.max_queue = options_.max_queue;
  info_.max_wait = options_.max_wait;
  info_.kv_budget_bytes = options_.kv.budget_bytes;
  pool_ = std::make_unique<DevicePool>(std::move(devices));
  batcher_ = std::make_unique<Batcher>(
      Batcher::Options{options_.max_batch, options_.max_wait, options_.max_queue},
      [this](std::vector<PendingCall> calls) { RunBatch(std::move(calls)); },
      [this] { pool_->AwaitCapacity(); });
}

EngineImpl::~EngineImpl() {
  batcher_.reset();  // runs what is queued and joins
  pool_.reset();     // finishes those batches and joins
}

absl::Status EngineImpl::RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                                        TensorView<const Bf16, 3> latent) {
  return store_->RegisterPrefix(prefix_id, parent_id, latent);
}
absl::Status EngineImpl::ReleasePrefix(absl::string_view prefix_id) {
  return store_->ReleasePrefix(prefix_id);
}
absl::Status EngineImpl::CreateSequence(absl::string_view sequence_id, absl::string_view prefix_id) {
  return store_->CreateSequence(sequence_id, prefix_id);
}
absl::Status EngineImpl::ForkSequence(absl::string_view source_id, absl::string_view new_id) {
  return store_->ForkSequence(source_id, new_id);
}
absl::Status EngineImpl::ReleaseSequence(absl::string_view sequence_id) {
  return store_->ReleaseSequence(sequence_id);
}
absl::Status EngineImpl::AppendKv(absl::string_view sequence_id, int layer, int64_t start_position,
                                  TensorView<const Bf16, 2> rows) {
  return store_->Append(sequence_id, layer, start_position, rows);
}
absl::StatusOr<SequenceInfo> EngineImpl::GetSequence(absl::string_view sequence_id) const {
  return store_->GetSequence(sequence_id);
}

absl::Status EngineImpl::ValidateCall(const std::vector<DecodeQuery>& queries) const {
  const ModelConfig& m = options_.model;
  if (queries.empty()) return absl::InvalidArgumentError("queries: empty batch");
  if (static_cast<int>(queries.size()) > options_.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("queries: ", queries.size(),
                                                   " queries exceed max_batch ", options_.max_batch));
  }
  std::set<std::pair<std::string, int>> seen;
  for (int i = 0; i < static_cast<int>(queries.size()); ++i) {
    const DecodeQuery& q = queries[i];
    if (q.sequence_id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("queries[", i, "].sequence_id is empty"));
    }
    if (q.layer < 0 || q.layer >= m.layers) {
      return absl::InvalidArgumentError(absl::StrCat("queries[", i, "].layer = ", q.layer,
                                                     " is outside [0, ", m.layers, ")"));
    }
    if (q.sq < 1 || q.sq > options_.max_sq) {
      return absl::InvalidArgumentError(absl::StrCat("queries[", i, "].sq = ", q.sq,
                                                     " is outside [1, ", options_.max_sq, "]"));
    }
    if (!seen.emplace(q.sequence_id, q.layer).second) {
      return absl::InvalidArgumentError(absl::StrCat("queries[", i, "]: sequence '", q.sequence_id,
                                                     "' layer ", q.layer, " appears twice in one call"));
    }
    const int64_t tokens = static_cast<int64_t>(q.sq) * m.heads;
    if (q.space == QuerySpace::kHead) {
      RETURN_IF_ERROR(CheckSize(q.q_nope, tokens * m.dn, i, "q_nope"));
      RETURN_IF_ERROR(CheckSize(q.q_pe, tokens * m.dr, i, "q_pe"));
      if (!AllFinite(q.q_nope) || !AllFinite(q.q_pe)) {
        return absl::InvalidArgumentError(absl::StrCat("queries[", i, "].q holds NaN or Inf"));
      }
    } else {
      RETURN_IF_ERROR(CheckSize(q.q_latent, tokens * m.dk_latent(), i, "q_latent"));
      if (!AllFinite(q.q_latent)) {
        return absl::InvalidArgumentError(absl::StrCat("queries[", i, "].q holds NaN or Inf"));
      }
    }
    if (q.append_position >= 0) {
      if (q.append_rows.empty() || q.append_rows.size() % m.dk_latent() != 0) {
        return absl::InvalidArgumentError(absl::StrCat("queries[", i, "].append_rows has ",
                                                       q.append_rows.size(), " values, not a positive multiple of ",
                                                       m.dk_latent()));
      }
    } else if (!q.append_rows.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("queries[", i, "].append_rows given without append_position"));
    }
    if (!store_->GetSequence(q.sequence_id).ok()) {
      return absl::NotFoundError(absl::StrCat("queries[", i, "].sequence_id '", q.sequence_id,
                                              "' is not a sequence"));
    }
  }
  return absl::OkStatus();
}

void EngineImpl::Decode(std::vector<DecodeQuery> queries, DecodeOptions options, DecodeCallback done) {
  if (absl::Status status = ValidateCall(queries); !status.ok()) {
    std::move(done)(status);
    return;
  }
  PendingCall call{std::move(queries), std::move(options), std::move(done), absl::Now()};
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    ++calls_in_flight_;
  }
  if (absl::Status status = batcher_->Enqueue(call); !status.ok()) {
    Finish(call, status);
  }
}

void EngineImpl::Finish(PendingCall& call, absl::StatusOr<std::vector<DecodeAnswer>> result) {
  std::move(call.done)(std::move(result));
  std::lock_guard<std::mutex> lock(calls_mu_);
  if (--calls_in_flight_ == 0) calls_done_.notify_all();
}

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

}  // namespace

void EngineImpl::RunBatch(std::vector<PendingCall> calls) {
  // Calls that are already abandoned, or whose appends fail, answer now.
  std::vector<PendingCall> live;
  for (PendingCall& call : calls) {
    absl::Status status = Checkpoint(call, "before device work");
    for (size_t i = 0; status.ok() && i < call.queries.size(); ++i) {
      const DecodeQuery& q = call.queries[i];
      if (q.append_position < 0) continue;
      const int64_t rows = static_cast<int64_t>(q.append_rows.size()) / options_.model.dk_latent();
      auto view = TensorView<const Bf16, 2>::Create(std::span<const Bf16>(q.append_rows),
                                                    {rows, options_.model.dk_latent()}, "append_rows");
      status = view.ok() ? store_->Append(q.sequence_id, q.layer, q.append_position, *view) : view.status();
      if (!status.ok()) {
        status = absl::Status(status.code(), absl::StrCat("queries[", i, "] append: ", status.message()));
      }
    }
    if (status.ok()) {
      live.push_back(std::move(call));
    } else {
      Finish(call, status);
    }
  }
  if (live.empty()) return;

  std::vector<const DecodeQuery*> queries;
  std::vector<std::pair<int, int>> origin;  // batch index -> (call, query)
  for (int c = 0; c < static_cast<int>(live.size()); ++c) {
    for (int i = 0; i < static_cast<int>(live[c].queries.size()); ++i) {
      queries.push_back(&live[c].queries[i]);
      origin.emplace_back(c, i);
    }
  }
  Planner::Result planned = planner_.Plan(*store_, weights_, queries);
  std::vector<absl::Status> call_status(live.size());
  for (const auto& [index, status] : planned.failed) {
    const auto [c, i] = origin[index];
    call_status[c] = absl::Status(status.code(), absl::StrCat("queries[", i, "]: ", status.message()));
  }
  int hybrid = 0, absorb = 0;
  std::vector<int> group_of(queries.size(), -1);
  for (int g = 0; g < static_cast<int>(planned.plan.groups.size()); ++g) {
    const GroupPlan& group = planned.plan.groups[g];
    (group.formulation == Formulation::kHybrid ? hybrid : absorb) += 1;
    for (int member : group.members) group_of[member] = g;
  }
  batches_.fetch_add(1);
  queries_.fetch_add(static_cast<int64_t>(queries.size()));
  hybrid_groups_.fetch_add(hybrid);
  absorb_groups_.fetch_add(absorb);

  auto plan = std::make_shared<const BatchPlan>(std::move(planned.plan));
  // The completion owns the calls; it runs on the device's thread.
  struct Batch {
    std::vector<PendingCall> calls;
    std::vector<absl::Status> call_status;
    std::vector<std::pair<int, int>> origin;
    std::vector<int> group_of;
    int hybrid, absorb;
  };
  auto batch = std::make_shared<Batch>(Batch{std::move(live), std::move(call_status), std::move(origin),
                                             std::move(group_of), hybrid, absorb});
  pool_->Submit(plan, weights_, [this, plan, batch](int device, absl::StatusOr<DeviceRun> run) mutable {
    BatchReport report;
    report.device = device;
    report.queries = static_cast<int>(batch->origin.size());
    report.hybrid_groups = batch->hybrid;
    report.absorb_groups = batch->absorb;
    report.status = run.status();
    if (run.ok()) {
      report.modeled_us = run->modeled_us;
      report.host_ms = run->host_ms;
    }
    if (options_.on_batch) options_.on_batch(report);

    // The device started host_ms before it answered (the callback follows Run at once).
    const absl::Time device_start = absl::Now() - absl::Milliseconds(run.ok() ? run->host_ms : 0.0);
    std::vector<std::vector<DecodeAnswer>> answers(batch->calls.size());
    for (size_t c = 0; c < batch->calls.size(); ++c) answers[c].resize(batch->calls[c].queries.size());
    if (run.ok()) {
      for (size_t index = 0; index < batch->origin.size(); ++index) {
        const auto [c, i] = batch->origin[index];
        if (batch->group_of[index] < 0) continue;  // failed in planning
        const GroupPlan& group = plan->groups[batch->group_of[index]];
        DecodeAnswer& answer = answers[c][i];
        answer.out = std::move(run->outputs[index].out);
        answer.lse = std::move(run->outputs[index].lse);
        answer.plan = PlanInfo{group.formulation,
                               group.prefix_id,
                               static_cast<int>(group.members.size()),
                               group.b_theta,
                               device,
                               static_cast<int>(batch->origin.size()),
                               absl::ToDoubleMicroseconds(device_start - batch->calls[c].submitted),
                               run->modeled_us,
                               run->host_ms};
      }
    }
    plan.reset();  // unpin before answering: a caller may release what it read
    for (size_t c = 0; c < batch->calls.size(); ++c) {
      PendingCall& call = batch->calls[c];
      absl::Status status = run.ok() ? batch->call_status[c] : run.status();
      if (status.ok()) status = Checkpoint(call, "after device work");
      if (status.ok()) {
        Finish(call, std::move(answers[c]));
      } else {
        Finish(call, status);
      }
    }
  });
}

EngineStats EngineImpl::Stats() const {
  EngineStats stats;
  stats.kv = store_->Stats();
  stats.batches = batches_.load();
  stats.queries = queries_.load();
  stats.hybrid_groups = hybrid_groups_.load();
  stats.absorb_groups = absorb_groups_.load();
  stats.queued = batcher_->queued();
  return stats;
}

absl::Status EngineImpl::Drain(absl::Time deadline) {
  batcher_->Stop();
  std::unique_lock<std::mutex> lock(calls_mu_);
  if (!calls_done_.wait_until(lock, absl::ToChronoTime(deadline), [&] { return calls_in_flight_ == 0; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("drain: ", calls_in_flight_, " decode calls still in flight at the deadline"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(EngineOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<EngineImpl> engine, EngineImpl::Create(std::move(options)));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace mlaserve::engine
