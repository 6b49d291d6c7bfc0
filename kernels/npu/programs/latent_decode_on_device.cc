#include "kernels/npu/programs/latent_decode_on_device.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/npu/programs/attention_schedule.h"

namespace mlaserve::npu {

LatentDecodeLaunch::~LatentDecodeLaunch() {
  kernel_.reset();
  if (workspace_ != nullptr) ReleaseAttentionWorkspace(gm_, *workspace_);
  for (const GmBuffer& b : owned_) gm_.Release(b);
}

absl::Status LatentDecodeLaunch::Build(int heads, int sq, std::span<const int32_t> seqlens,
                                       bool causal, int dk, int dv, float scale, int page_size,
                                       int width, const std::function<int32_t(int, int)>& page_of,
                                       const AttentionDeviceKernelOptions& options, int max_blocks,
                                       bool backed) {
  rows_ = static_cast<int64_t>(seqlens.size()) * sq * heads;
  dv_ = dv;
  ASSIGN_OR_RETURN(out_, gm_.Allocate(std::max<int64_t>(rows_ * dv * 4, 1), backed, "out"));
  owned_.push_back(out_);
  ASSIGN_OR_RETURN(lse_, gm_.Allocate(std::max<int64_t>(rows_ * 4, 1), backed, "lse"));
  owned_.push_back(lse_);

  workload_.dk = dk;
  workload_.dv = dv;
  workload_.softmax_scale = scale;
  const int rows_per_request = sq * heads;
  for (int b = 0; b < static_cast<int>(seqlens.size()); ++b) {
    const int length = seqlens[b];
    std::vector<int32_t> pages;
    for (int j = 0; j * page_size < length; ++j) pages.push_back(page_of(b, j));
    for (int r0 = 0; r0 < rows_per_request; r0 += kMaxGroupRows) {
      RowGroup g;
      g.rows = std::min(kMaxGroupRows, rows_per_request - r0);
      const int64_t first_row = static_cast<int64_t>(b) * rows_per_request + r0;
      g.q = q_.Slice(first_row * dk * 2, static_cast<int64_t>(g.rows) * dk * 2);
      g.out = out_.Slice(first_row * dv * 4, static_cast<int64_t>(g.rows) * dv * 4);
      g.lse = lse_.Slice(first_row * 4, static_cast<int64_t>(g.rows) * 4);
      for (int r = r0; r < r0 + g.rows; ++r) {
        g.visible.push_back(VisibleKeys(length, sq, r / heads, causal));
      }
      g.keys = PagedKeys{pool_, page_size, width, pages};
      workload_.groups.push_back(std::move(g));
    }
  }
  auto schedule = ScheduleAttention(workload_, max_blocks);
  if (schedule.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(AttentionWorkspace workspace,
                   AllocateAttentionWorkspace(gm_, workload_, static_cast<int>(schedule.size()),
                                              options, backed));
  workspace_ = std::make_unique<AttentionWorkspace>(std::move(workspace));
  kernel_ = std::make_unique<AttentionDeviceKernel>(workload_, std::move(schedule), *workspace_, options);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> LatentDecodeLaunch::Prepare(
    Device& device, const LatentDecodeProblem& p, const AttentionDeviceKernelOptions& options) {
  RETURN_IF_ERROR(ValidateLatentDecodeProblem(p));
  const auto& pages = p.cache.pages;
  if (pages.stride(1) != p.dk() ||
      pages.stride(0) != static_cast<int64_t>(p.cache.page_size()) * p.dk()) {
    return absl::InvalidArgumentError("the device maps the cache as dense [pages][page_size][width]");
  }
  std::unique_ptr<LatentDecodeLaunch> launch(new LatentDecodeLaunch(device.gm()));
  GlobalMemory& gm = device.gm();
  const int64_t rows = static_cast<int64_t>(p.batch()) * p.sq() * p.heads();
  ASSIGN_OR_RETURN(launch->q_, gm.Allocate(std::max<int64_t>(rows * p.dk() * 2, 1), true, "q"));
  launch->owned_.push_back(launch->q_);
  ASSIGN_OR_RETURN(launch->pool_, gm.Map(const_cast<Bf16*>(pages.data()),
                                         std::max<int64_t>(pages.size() * 2, 1), "KV pool"));
  launch->owned_.push_back(launch->pool_);
  Bf16* q = launch->q_.as<Bf16>();
  for (int b = 0; b < p.batch(); ++b)
    for (int s = 0; s < p.sq(); ++s)
      for (int h = 0; h < p.heads(); ++h) {
        const int64_t row = (static_cast<int64_t>(b) * p.sq() + s) * p.heads() + h;
        std::memcpy(q + row * p.dk(), p.q.row(b, s, h), p.dk() * sizeof(Bf16));
      }
  RETURN_IF_ERROR(launch->Build(p.heads(), p.sq(), p.seqs.seqlens, p.causal, p.dk(), p.dv,
                                p.softmax_scale, p.cache.page_size(), p.cache.width(),
                                [&](int b, int j) { return p.seqs.block_table(b, j); }, options,
                                device.profile().cube_cores, /*backed=*/true));
  return launch;
}

absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> LatentDecodeLaunch::PrepareModel(
    Device& device, const LatentDecodeShape& shape, const AttentionDeviceKernelOptions& options) {
  if (shape.heads <= 0 || shape.sq <= 0 || shape.page_size <= 0 || shape.seqlens.empty()) {
    return absl::InvalidArgumentError("shape needs heads, sq, page_size and at least one sequence");
  }
  std::unique_ptr<LatentDecodeLaunch> launch(new LatentDecodeLaunch(device.gm()));
  GlobalMemory& gm = device.gm();
  const int64_t batch = static_cast<int64_t>(shape.seqlens.size());
  std::vector<int32_t> first_page(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    first_page[b + 1] = first_page[b] + (shape.seqlens[b] + shape.page_size - 1) / shape.page_size;
  }
  ASSIGN_OR_RETURN(launch->q_, gm.Allocate(batch * shape.sq * shape.heads * shape.dk * 2, false, "q"));
  launch->owned_.push_back(launch->q_);
  ASSIGN_OR_RETURN(launch->pool_, gm.Allocate(std::max<int64_t>(first_page[batch], 1) *
                                                  shape.page_size * shape.dk * 2,
                                              false, "KV pool"));
  launch->owned_.push_back(launch->pool_);
  RETURN_IF_ERROR(launch->Build(shape.heads, shape.sq, shape.seqlens, shape.causal, shape.dk,
                                shape.dv, 1.0f, shape.page_size, shape.dk,
                                [&](int b, int j) { return first_page[b] + j; }, options,
                                device.profile().cube_cores, /*backed=*/false));
  return launch;
}

AttentionOutput LatentDecodeLaunch::ReadOutput() const {
  AttentionOutput output;
  output.out.assign(out_.as<float>(), out_.as<float>() + rows_ * dv_);
  output.lse.assign(lse_.as<float>(), lse_.as<float>() + rows_);
  for (const RowGroup& g : workload_.groups) {
    if (g.length() > 0) continue;  // never launched: the early-exit answer
    const int64_t first = static_cast<int64_t>(g.lse.addr - lse_.addr) / 4;
    std::fill_n(output.out.begin() + first * dv_, static_cast<int64_t>(g.rows) * dv_, 0.0f);
    std::fill_n(output.lse.begin() + first, g.rows, -std::numeric_limits<float>::infinity());
  }
  return output;
}

absl::StatusOr<DeviceDecodeResult> RunLatentDecodeOnDevice(Device& device,
                                                           const LatentDecodeProblem& problem,
                                                           const AttentionDeviceKernelOptions& options) {
  ASSIGN_OR_RETURN(auto launch, LatentDecodeLaunch::Prepare(device, problem, options));
  DeviceDecodeResult result;
  if (launch->kernel() != nullptr) {
    ASSIGN_OR_RETURN(result.report, device.Launch(*launch->kernel(), ExecutionMode::kExecute));
  }
  result.output = launch->ReadOutput();
  return result;
}

absl::StatusOr<LaunchReport> ModelLatentDecodeOnDevice(Device& device, const LatentDecodeShape& shape,
                                                       const AttentionDeviceKernelOptions& options) {
  ASSIGN_OR_RETURN(auto launch, LatentDecodeLaunch::PrepareModel(device, shape, options));
  if (launch->kernel() == nullptr) return LaunchReport{};
  return device.Launch(*launch->kernel(), ExecutionMode::kModelOnly);
}

}  // namespace mlaserve::npu
