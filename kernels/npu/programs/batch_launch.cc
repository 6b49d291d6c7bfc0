#include "kernels/npu/programs/batch_launch.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/npu/programs/attention_schedule.h"
#include "kernels/npu/programs/combine_kernel.h"
#include "kernels/npu/programs/projection_kernel.h"

namespace mlaserve::npu {

// An attention launch's workload and workspace, which its kernel refers to.
struct BatchLaunch::AttentionLaunch {
  AttentionWorkload workload;
  AttentionWorkspace workspace;
};

BatchLaunch::BatchLaunch(Device& device, bool backed) : device_(device), backed_(backed) {}

BatchLaunch::~BatchLaunch() {
  kernels_.clear();
  for (const auto& launch : attention_) ReleaseAttentionWorkspace(device_.gm(), launch->workspace);
  for (const GmBuffer& b : buffers_) device_.gm().Release(b);
}

absl::StatusOr<std::unique_ptr<BatchLaunch>> BatchLaunch::Create(
    Device& device, const BatchSteps& steps, const AttentionDeviceKernelOptions& options,
    bool backed) {
  RETURN_IF_ERROR(ValidateBatchSteps(steps));
  if (backed) RETURN_IF_ERROR(CheckExecutable(steps));
  std::unique_ptr<BatchLaunch> launch(new BatchLaunch(device, backed));
  RETURN_IF_ERROR(launch->Place(steps));
  if (backed) launch->Stage(steps);
  RETURN_IF_ERROR(launch->Lower(steps, options));
  return launch;
}

absl::Status BatchLaunch::Place(const BatchSteps& steps) {
  GlobalMemory& gm = device_.gm();
  for (const StepBuffer& b : steps.buffers) {
    const int64_t element = ElementBytes(b.type);
    const int64_t bytes = std::max<int64_t>(b.elements * element, 1);
    GmBuffer placed;
    if (b.kind == StepBuffer::Kind::kInput && b.input != nullptr) {
      ASSIGN_OR_RETURN(placed, gm.Map(const_cast<void*>(b.input), bytes, b.name));
    } else {
      ASSIGN_OR_RETURN(placed, gm.Allocate(bytes, backed_, b.name));  // model-only: no memory
    }
    buffers_.push_back(placed);
    element_bytes_.push_back(element);
    if (backed_ && placed.host != nullptr) FillStepBuffer(b.fill, placed.host, bytes);
  }
  return absl::OkStatus();
}

void BatchLaunch::Stage(const BatchSteps& steps) {
  for (const StageCopy& copy : steps.staging) {
    RunStageCopy(copy, At(copy.dst).as<Bf16>());
  }
}

GmBuffer BatchLaunch::At(const BufferRef& ref) const {
  const GmBuffer& b = buffers_[ref.buffer];
  const int64_t offset = ref.offset * element_bytes_[ref.buffer];
  return b.Slice(offset, b.bytes - offset);
}

std::span<const std::byte> BatchLaunch::Bytes(int buffer) const {
  const GmBuffer& b = buffers_[buffer];
  return {b.host, static_cast<size_t>(b.host == nullptr ? 0 : b.bytes)};
}

absl::Status BatchLaunch::Lower(const BatchSteps& steps,
                                const AttentionDeviceKernelOptions& options) {
  const int max_blocks = device_.profile().cube_cores;
  const auto at = [this](const BufferRef& ref) { return At(ref); };
  for (const BatchStep& step : steps.steps) {
    if (const auto* projection = std::get_if<ProjectionStep>(&step)) {
      std::vector<ProjectionJob> jobs;
      for (const mlaserve::ProjectionJob& j : projection->jobs) jobs.push_back(j.Map(at));
      kernels_.push_back(std::make_unique<ProjectionKernel>(std::move(jobs), max_blocks));
    } else if (const auto* attention = std::get_if<AttentionStep>(&step)) {
      auto launch = std::make_unique<AttentionLaunch>();
      AttentionWorkload& w = launch->workload;
      w.dk = attention->dk;
      w.dv = attention->dv;
      w.softmax_scale = attention->softmax_scale;
      for (const AttentionRowGroup& g : attention->groups) {
        RowGroup rg;
        rg.q = At(g.q).Slice(0, int64_t{g.rows} * attention->dk * 2);
        rg.rows = g.rows;
        rg.visible = g.visible;
        if (const auto* paged = std::get_if<PagedKeysRef>(&g.keys)) {
          rg.keys = PagedKeys{At(paged->pool), paged->page_size, paged->width,
                              std::vector<int32_t>(paged->pages.begin(), paged->pages.end()),
                              paged->first_token};
        } else if (const auto* fp8 = std::get_if<Fp8PagedKeysRef>(&g.keys)) {
          rg.keys =
              Fp8Keys{At(fp8->pool), fp8->layout,
                      std::vector<int32_t>(fp8->pages.begin(), fp8->pages.end()), fp8->first_token};
        } else {
          const auto& dense = std::get<DenseKeysRef>(g.keys);
          rg.keys = DenseKeys{At(dense.k), dense.ldk, At(dense.v), dense.ldv};
        }
        rg.out = At(g.out);
        rg.out_stride = g.out_stride;
        rg.out_bf16 = g.out_bf16;
        rg.lse = At(g.lse);
        rg.lse_stride = g.lse_stride;
        w.groups.push_back(std::move(rg));
      }
      w.fp8_quantize_queries = attention->fp8_quantize_queries;
      AttentionDeviceKernelOptions kernel_options = options;
      kernel_options.algorithm = attention->algorithm;
      kernel_options.fp8_matrix = device_.profile().HasFp8Matrix();
      // Refused before any launch is made, naming the step.
      if (absl::Status s = CheckAttentionSupported(w, kernel_options); !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat("attention step '", attention->name, "': ", s.message()));
      }
      auto schedule = ScheduleAttention(w, max_blocks);
      if (schedule.empty()) continue;  // no row sees a key: the destinations' fill stands
      ASSIGN_OR_RETURN(launch->workspace, AllocateAttentionWorkspace(
                                              device_.gm(), w, static_cast<int>(schedule.size()),
                                              kernel_options, backed_));
      kernels_.push_back(std::make_unique<AttentionDeviceKernel>(
          w, std::move(schedule), launch->workspace, kernel_options));
      attention_.push_back(std::move(launch));
    } else {
      const auto& combine = std::get<CombineStep>(step);
      std::vector<CombineJob> jobs;
      for (const mlaserve::CombineJob& j : combine.jobs) jobs.push_back(j.Map(at));
      kernels_.push_back(std::make_unique<CombineKernel>(std::move(jobs), max_blocks));
    }
  }
  return absl::OkStatus();
}

LaunchReport Summarize(const BatchLaunchReport& report, const DeviceProfile& profile) {
  LaunchReport sum;
  for (const LaunchReport& l : report.launches) {
    sum.kernel = sum.kernel.empty() ? l.kernel : absl::StrCat(sum.kernel, "+", l.kernel);
    sum.block_dim = std::max(sum.block_dim, l.block_dim);
    sum.modeled_cycles += l.modeled_cycles;
    sum.modeled_us += l.modeled_us;
    sum.flops += l.flops;
    sum.instructions += l.instructions;
    sum.gm_read_bytes += l.gm_read_bytes;
    sum.hbm_read_bytes += l.hbm_read_bytes;
    sum.gm_write_bytes += l.gm_write_bytes;
    sum.host_record_ms += l.host_record_ms;
    sum.host_model_ms += l.host_model_ms;
    if (l.host_ms) sum.host_ms = sum.host_ms.value_or(0.0) + *l.host_ms;
    for (const auto& [pipe, busy] : l.pipe_busy) sum.pipe_busy[pipe] += busy * l.modeled_us;
    for (const auto& [shape, count] : l.mmad_shapes) sum.mmad_shapes[shape] += count;
  }
  for (auto& [pipe, busy] : sum.pipe_busy) busy = sum.modeled_us > 0 ? busy / sum.modeled_us : 0.0;
  sum.fu = sum.modeled_us > 0 ? sum.flops / (sum.modeled_us * 1e-6 * profile.PeakFlops()) : 0.0;
  return sum;
}

absl::StatusOr<BatchLaunchReport> BatchLaunch::Run(ExecutionMode mode) {
  if (mode == ExecutionMode::kExecute && !backed_) {
    return absl::FailedPreconditionError("batch launch: a model-only launch cannot execute");
  }
  BatchLaunchReport report;
  std::vector<const DeviceKernel*> kernels;
  for (const auto& kernel : kernels_) kernels.push_back(kernel.get());
  ASSIGN_OR_RETURN(report.launches, device_.LaunchSequence(kernels, mode));
  for (const LaunchReport& launch : report.launches) report.modeled_us += launch.modeled_us;
  return report;
}

}  // namespace mlaserve::npu
