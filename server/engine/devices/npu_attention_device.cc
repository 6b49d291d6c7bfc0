#include "server/engine/devices/npu_attention_device.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/status_macros.h"
#include "server/engine/devices/group_inputs.h"
#include "server/engine/devices/npu_batch_launch.h"

namespace mlaserve::engine {
namespace {

// Host arrays mapped into a device's global memory for one batch; unmapped on destruction.
class BatchMappings {
 public:
  explicit BatchMappings(npu::GlobalMemory& gm) : gm_(gm) {}
  ~BatchMappings() {
    for (const auto& [host, buffer] : mapped_) gm_.Release(buffer);
  }
  BatchMappings(const BatchMappings&) = delete;
  BatchMappings& operator=(const BatchMappings&) = delete;

  template <typename T>
  absl::StatusOr<npu::GmBuffer> Map(std::span<const T> host, const char* what) {
    auto it = mapped_.find(host.data());
    if (it != mapped_.end()) return it->second;
    ASSIGN_OR_RETURN(npu::GmBuffer b, gm_.Map(const_cast<T*>(host.data()),
                                              std::max<int64_t>(host.size_bytes(), 1), what));
    mapped_.emplace(host.data(), b);
    return b;
  }

 private:
  npu::GlobalMemory& gm_;
  absl::flat_hash_map<const void*, npu::GmBuffer> mapped_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NpuAttentionDevice>> NpuAttentionDevice::Create(
    npu::DeviceProfile profile, npu::DeviceOptions device_options,
    npu::AttentionDeviceKernelOptions kernel_options) {
  if (kernel_options.algorithm != RescaleAlgorithm::kAmla) {
    // The pool's devices must agree with the host's AMLA arithmetic bit for bit.
    return absl::InvalidArgumentError("npu attention device: only the AMLA kernel serves");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<npu::Device> device,
                   npu::Device::Create(std::move(profile), device_options));
  return std::unique_ptr<NpuAttentionDevice>(
      new NpuAttentionDevice(std::move(device), kernel_options));
}

NpuAttentionDevice::NpuAttentionDevice(std::unique_ptr<npu::Device> device,
                                       npu::AttentionDeviceKernelOptions options)
    : device_(std::move(device)), options_(options) {
  const npu::DeviceProfile& p = device_->profile();
  info_.profile = p.name;
  info_.host_threads = device_->host_threads();
  info_.matrix_tflops = p.PeakFlops() / 1e12;
  info_.hbm_tbps = p.HbmBytesPerSecond() / 1e12;
}

absl::StatusOr<DeviceRun> NpuAttentionDevice::Run(const BatchPlan& plan,
                                                  const ModelWeights& weights) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& m = weights.config();
  BatchMappings mappings(device_->gm());
  std::vector<GroupInputs> inputs;  // the staged queries' source, alive until staging is done
  inputs.reserve(plan.groups.size());
  std::vector<NpuGroup> groups;
  for (const GroupPlan& group : plan.groups) {
    const GroupInputs& in = inputs.emplace_back(GatherGroupInputs(plan, group, m));
    NpuGroup g;
    g.space = group.space;
    g.members = in.members;
    g.sq = group.sq;
    g.lengths = in.lengths;
    g.visible = in.visible;
    g.absorb_from = group.AbsorbFrom();
    ASSIGN_OR_RETURN(g.kv_b, mappings.Map(weights.KvBProj(group.layer), "kv_b_proj"));
    for (int member : group.members) {
      const PlannedQuery& pq = plan.queries[member];
      const KvSnapshot& snapshot = plan.snapshots[pq.snapshot];
      const auto& pages = snapshot.cache().pages;
      ASSIGN_OR_RETURN(g.pool, mappings.Map(std::span<const Bf16>(pages.data(), pages.size()), "KV pool"));
      g.page_size = snapshot.cache().page_size();
      g.pages.push_back(snapshot.sequence(pq.sequence).pages);
    }
    for (const ExpandedKv& level : group.levels) {
      NpuLevel l{level.begin(), level.end(), {}, {}};
      ASSIGN_OR_RETURN(l.keys, mappings.Map(level.keys(), "expanded K"));
      ASSIGN_OR_RETURN(l.values, mappings.Map(level.values(), "expanded V"));
      g.levels.push_back(l);
    }
    g.q_nope = in.q_nope.empty() ? nullptr : in.q_nope.data();
    g.q_pe = in.q_pe.empty() ? nullptr : in.q_pe.data();
    g.q_latent = in.q_latent.empty() ? nullptr : in.q_latent.data();
    groups.push_back(std::move(g));
  }
  ASSIGN_OR_RETURN(auto launch, NpuBatchLaunch::Create(*device_, m, std::move(groups), options_,
                                                       /*backed=*/true));
  ASSIGN_OR_RETURN(NpuBatchReport report, launch->Run(npu::ExecutionMode::kExecute));
  DeviceRun run;
  run.outputs.resize(plan.queries.size());
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    ScatterGroupOutputs(plan.groups[g], m.heads, launch->width(static_cast<int>(g)),
                        launch->out(static_cast<int>(g)), launch->lse(static_cast<int>(g)), run);
  }
  run.modeled_us = report.modeled_us;
  run.host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace mlaserve::engine
