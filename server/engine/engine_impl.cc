#include "server/engine/engine_impl.h"

#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/core/cpu_features.h"
#include "kernels/core/matmul.h"
#include "kernels/gpu/open_gpu.h"
#include "server/engine/decode_validation.h"
#include "server/engine/devices/gpu_attention_device.h"
#include "server/engine/devices/host_attention_device.h"
#include "server/engine/devices/npu_attention_device.h"
#include "server/engine/devices/pool_sizing.h"

namespace mlaserve::engine {

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
  if (devices.empty() && !options.gpu.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<gpu::GpuRuntime> runtime, gpu::OpenGpu(options.gpu));
    devices.push_back(std::make_unique<GpuAttentionDevice>(std::move(runtime), options.gpu));
  }
  if (devices.empty()) {
    if (options.devices < 1)
      return absl::InvalidArgumentError("engine options: devices must be >= 1");
    if (options.host_threads_per_device < 1) {
      return absl::InvalidArgumentError("engine options: host_threads_per_device must be >= 1");
    }
    if (options.profile == "host") {
      for (int i = 0; i < options.devices; ++i) {
        devices.push_back(std::make_unique<HostAttentionDevice>(options.host_threads_per_device));
      }
    } else {
      absl::StatusOr<npu::DeviceProfile> profile = npu::LoadDeviceProfile(options.profile);
      if (!profile.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("engine options: profile '", options.profile,
                                                       "': ", profile.status().message()));
      }
      npu::DeviceOptions device_options;
      device_options.host_threads = options.host_threads_per_device;
      const int lendable = options.shared_cpus > 0
                               ? LentThreads(options.shared_cpus, options.host_threads_per_device)
                               : 0;
      for (int i = 0; i < options.devices; ++i) {
        ASSIGN_OR_RETURN(auto device,
                         NpuAttentionDevice::Create(*profile, device_options,
                                                    {.preload = options.preload}, lendable));
        devices.push_back(std::move(device));
      }
    }
  }
  // The threshold uses the first device's rates unless overridden (a pool is homogeneous in
  // practice; with mixed devices the planner would need per-device thresholds).
  DeviceRates rates;
  const DeviceInfo& first = devices.front()->info();
  // A device that knows what its kernels attain is planned on that, not on its peak.
  const double device_tflops =
      first.absorb_matrix_tflops > 0 ? first.absorb_matrix_tflops : first.matrix_tflops;
  rates.matrix_flops = (options.matrix_tflops > 0 ? options.matrix_tflops : device_tflops) * 1e12;
  rates.naive_matrix_flops = first.naive_matrix_tflops * 1e12;
  rates.memory_bytes_per_second = (options.hbm_tbps > 0 ? options.hbm_tbps : first.hbm_tbps) * 1e12;
  rates.fp8_matrix_flops = first.fp8_matrix_tflops * 1e12;
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
  // CPU devices (the emulated NPUs, the host) read the projections' weights in their matrix
  // unit's layout rather than copying each operand out of the checkpoint's per call; a GPU
  // uploads the checkpoint's layout and keeps its own.
  if (first.kind != "gpu") RETURN_IF_ERROR(weights->AddMatrixTiles());
  // A device with memory of its own (a GPU: the pool is that one device) keeps the store there.
  absl::StatusOr<KvResidency> residency =
      devices.size() == 1 ? devices.front()->PlanKvResidency(weights->bytes())
                          : absl::UnimplementedError("a pool of several devices");
  if (residency.ok()) {
    options.kv.page_writes = residency->page_writes;
    options.kv.expansions = residency->expansions;
    if (options.kv.budget_bytes == 0) {
      if (residency->default_budget_bytes <= 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat(devices.front()->info().profile,
                         ": no device memory left for a KV cache after the "
                         "weights (",
                         weights->bytes(), " bytes) and the reserve"));
      }
      options.kv.budget_bytes = residency->default_budget_bytes;
    }
  } else if (residency.status().code() != absl::StatusCode::kUnimplemented) {
    return residency.status();
  }
  if (options.kv.budget_bytes == 0) options.kv.budget_bytes = kDefaultHostKvBudget;
  ASSIGN_OR_RETURN(auto store, KvStore::Create(options.model, options.kv));
  for (const auto& device : devices) RETURN_IF_ERROR(device->Attach(*weights, *store));
  return std::unique_ptr<EngineImpl>(new EngineImpl(std::move(options), *std::move(weights),
                                                    std::move(store), rates, std::move(devices)));
}

EngineImpl::EngineImpl(EngineOptions options, ModelWeights weights, std::unique_ptr<KvStore> store,
                       DeviceRates rates, std::vector<std::unique_ptr<AttentionDevice>> devices)
    : options_(std::move(options)),
      weights_(std::move(weights)),
      store_(std::move(store)),
      planner_(options_.model, rates, options_.max_sq,
               {.tree_aware = options_.tree_aware_grouping, .hybrid = options_.typhoon}),
      context_{*store_,
               weights_,
               planner_,
               devices.front()->info(),
               options_.on_batch,
               counters_,
               [this] { CallAnswered(); }} {
  info_.model = options_.model;
  info_.host = HostInfo{HostCpu().model, HostCpu().logical_cores, HostCpu().MatrixIsa(),
                        MatrixUnitBackend(), options_.sizing};
  info_.page_size = store_->page_size();
  info_.fp8_page_tokens = store_->Stats().page_tokens_fp8;
  info_.default_kv_dtype = store_->default_kv_dtype();
  for (const auto& device : devices) info_.devices.push_back(device->info());
  info_.b_theta_by_sq = planner_.BThetaBySq();
  info_.fp8_b_theta_by_sq = planner_.BThetaBySq(KvDtype::kFp8);
  info_.max_batch = options_.max_batch;
  info_.max_sq = options_.max_sq;
  info_.max_queue = options_.max_queue;
  info_.max_wait = options_.max_wait;
  info_.kv_budget_bytes = options_.kv.budget_bytes;
  info_.batch_invariant = options_.batch_invariant;
  pool_ = std::make_unique<DevicePool>(std::move(devices),
                                       /*lend_idle_cpus=*/options_.shared_cpus > 0);
  batcher_ = std::make_unique<Batcher>(
      Batcher::Options{{options_.max_batch, options_.max_wait}, options_.max_queue},
      [this](std::vector<PendingCall> calls) { CutBatch(std::move(calls)); },
      [this] {
        const DevicePool::Occupancy o = pool_->occupancy();
        return BatchPolicy::Devices{o.idle, o.has_room};
      });
  pool_->SetOnCapacity([this] { batcher_->DevicesChanged(); });
}

EngineImpl::~EngineImpl() {
  batcher_->Shutdown();  // what is queued goes to the pool; the batcher's thread ends
  pool_.reset();         // finishes those batches (telling the idle batcher as each ends)
}

absl::Status EngineImpl::RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                                        TensorView<const Bf16, 3> latent,
                                        std::optional<KvDtype> kv_dtype) {
  return store_->RegisterPrefix(prefix_id, parent_id, latent, kv_dtype);
}
absl::Status EngineImpl::ReleasePrefix(absl::string_view prefix_id) {
  return store_->ReleasePrefix(prefix_id);
}
absl::Status EngineImpl::CreateSequence(absl::string_view sequence_id, absl::string_view prefix_id,
                                        std::optional<KvDtype> kv_dtype) {
  return store_->CreateSequence(sequence_id, prefix_id, kv_dtype);
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
absl::Status EngineImpl::AppendKvFp8(absl::string_view sequence_id, int layer,
                                     int64_t start_position, std::span<const std::byte> records,
                                     int64_t n) {
  return store_->AppendFp8(sequence_id, layer, start_position, records, n);
}
absl::StatusOr<SequenceInfo> EngineImpl::GetSequence(absl::string_view sequence_id) const {
  return store_->GetSequence(sequence_id);
}

void EngineImpl::Decode(std::vector<DecodeQuery> queries, DecodeOptions options,
                        DecodeCallback done) {
  if (absl::Status health = Health(); !health.ok()) {
    std::move(done)(health);
    return;
  }
  if (absl::Status status = ValidateDecodeCall(queries, info_, *store_); !status.ok()) {
    std::move(done)(status);
    return;
  }
  if (absl::Status status = ValidateDecodeOptions(options); !status.ok()) {
    std::move(done)(status);
    return;
  }
  // Calls that ask for the model's scale batch with those that name no scale.
  const BatchKey key{options.softmax_scale.value_or(info_.model.softmax_scale),
                     QueryHeads(queries.front()), queries.front().first_head,
                     options.batch_invariant.value_or(info_.batch_invariant)};
  PendingCall call{std::move(queries), std::move(options), key, std::move(done), absl::Now()};
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    ++calls_in_flight_;
  }
  if (absl::Status status = batcher_->Enqueue(call); !status.ok()) {
    std::move(call.done)(status);
    CallAnswered();
  }
}

void EngineImpl::CallAnswered() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  if (--calls_in_flight_ == 0) calls_done_.notify_all();
}

void EngineImpl::CutBatch(std::vector<PendingCall> calls) {
  std::unique_ptr<BatchRun> run = BatchRun::Start(std::move(calls), context_);
  if (run == nullptr) return;
  pool_->Submit([run = std::move(run)](AttentionDevice& device, int index) mutable {
    run->Execute(device, index);
  });
}

std::shared_ptr<void> EngineImpl::MapHostMemory(const void* data, int64_t bytes) {
  return pool_->MapHostMemory(data, bytes);
}

EngineStats EngineImpl::Stats() const {
  EngineStats stats;
  stats.kv = store_->Stats();
  stats.batches = counters_.batches.load();
  stats.queries = counters_.queries.load();
  stats.hybrid_groups = counters_.hybrid_groups.load();
  stats.absorb_groups = counters_.absorb_groups.load();
  stats.queued = batcher_->queued();
  for (int d = 0; d < pool_->size(); ++d) {
    if (std::optional<DeviceMemory> m = pool_->device(d).memory(); m.has_value()) {
      stats.device_memory.emplace_back(d, *m);
    }
  }
  return stats;
}

absl::Status EngineImpl::Health() const {
  for (int d = 0; d < pool_->size(); ++d) {
    if (absl::Status s = pool_->device(d).health(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::Drain(absl::Time deadline) {
  batcher_->Stop();
  std::unique_lock<std::mutex> lock(calls_mu_);
  if (!calls_done_.wait_until(lock, absl::ToChronoTime(deadline),
                              [&] { return calls_in_flight_ == 0; })) {
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
