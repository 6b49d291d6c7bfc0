#include "kernels/npu/programs/latent_decode_on_device.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mlaserve::npu {
namespace {

// The problem's heads, widths and scale as a latent group's dims: values are the first dv
// columns of the dk-wide keys (c_kv), the rest is the rope part.
MlaDims LatentDims(int heads, int dk, int dv, float scale) {
  return MlaDims{heads, /*dn=*/1, /*dr=*/dk - dv, /*dl=*/dv, /*dv=*/1, scale};
}

}  // namespace

absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> LatentDecodeLaunch::Prepare(
    Device& device, const LatentDecodeProblem& p, const AttentionDeviceKernelOptions& options,
    int parallel_units) {
  RETURN_IF_ERROR(ValidateLatentDecodeProblem(p));
  const auto& pages = p.cache.pages;
  if (pages.stride(1) != p.dk() ||
      pages.stride(0) != static_cast<int64_t>(p.cache.page_size()) * p.dk() ||
      p.q.stride(2) != p.dk() || p.q.stride(1) != int64_t{p.heads()} * p.dk()) {
    return absl::InvalidArgumentError(
        "the device maps the cache as dense [pages][page_size][width], q as [b][sq][h][dk]");
  }
  DecodeBatch batch;
  batch.dims = LatentDims(p.heads(), p.dk(), p.dv, p.softmax_scale);
  batch.pool = pages.data();
  batch.pool_pages = p.cache.num_pages();
  batch.page_size = p.cache.page_size();
  batch.parallel_units = parallel_units;
  std::unique_ptr<LatentDecodeLaunch> l(new LatentDecodeLaunch());
  std::vector<const Bf16*> queries;
  for (int b = 0; b < p.batch(); ++b) {
    std::vector<int32_t>& table =
        l->pages_.emplace_back((p.seqs.seqlens[b] + p.cache.page_size() - 1) / p.cache.page_size());
    for (size_t j = 0; j < table.size(); ++j)
      table[j] = p.seqs.block_table(b, static_cast<int64_t>(j));
    queries.push_back(p.q.row(b, 0, 0));
  }
  RETURN_IF_ERROR(l->Lower(device, std::move(batch), p.sq(), p.causal, p.seqs.seqlens, queries,
                           options, /*backed=*/true));
  return l;
}

absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> LatentDecodeLaunch::PrepareFp8(
    Device& device, const Fp8LatentDecodeProblem& p, const AttentionDeviceKernelOptions& options,
    int parallel_units) {
  const Fp8PageLayout& layout = p.cache.layout;
  RETURN_IF_ERROR(ValidateFp8PagedDecode(p.softmax_scale, p.batch(), p.cache, p.seqs));
  if (p.dk() != layout.dl + layout.dr || p.q.stride(3) != 1 || p.q.stride(2) != p.dk() ||
      p.q.stride(1) != int64_t{p.heads()} * p.dk()) {
    return absl::InvalidArgumentError(
        "the device reads q as [b][sq][h][dl + dr] over the cache's dl + dr");
  }
  DecodeBatch batch;
  batch.dims = LatentDims(p.heads(), p.dk(), layout.dl, p.softmax_scale);
  batch.fp8_pool = {p.cache.base, p.cache.num_pages, layout};
  batch.parallel_units = parallel_units;
  std::unique_ptr<LatentDecodeLaunch> l(new LatentDecodeLaunch());
  std::vector<const Bf16*> queries;
  for (int b = 0; b < p.batch(); ++b) {
    std::vector<int32_t>& table =
        l->pages_.emplace_back((p.seqs.seqlens[b] + layout.page_size - 1) / layout.page_size);
    for (size_t j = 0; j < table.size(); ++j)
      table[j] = p.seqs.block_table(b, static_cast<int64_t>(j));
    queries.push_back(p.q.row(b, 0, 0));
  }
  RETURN_IF_ERROR(l->Lower(device, std::move(batch), p.sq(), p.causal, p.seqs.seqlens, queries,
                           options, /*backed=*/true, KvDtype::kFp8));
  return l;
}

absl::StatusOr<std::unique_ptr<LatentDecodeLaunch>> LatentDecodeLaunch::PrepareModel(
    Device& device, const LatentDecodeShape& shape, const AttentionDeviceKernelOptions& options,
    int parallel_units) {
  if (shape.heads <= 0 || shape.sq <= 0 || shape.page_size <= 0 || shape.seqlens.empty() ||
      shape.dv >= shape.dk) {
    return absl::InvalidArgumentError(
        "shape needs heads, sq, page_size, dk > dv and at least one sequence");
  }
  DecodeBatch batch;
  batch.dims = LatentDims(shape.heads, shape.dk, shape.dv, 1.0f);
  batch.page_size = shape.page_size;
  batch.parallel_units = parallel_units;
  std::unique_ptr<LatentDecodeLaunch> l(new LatentDecodeLaunch());
  int32_t next_page = 0;
  for (int32_t length : shape.seqlens) {
    std::vector<int32_t>& table =
        l->pages_.emplace_back((length + shape.page_size - 1) / shape.page_size);
    for (int32_t& page : table) page = next_page++;
  }
  batch.pool_pages = std::max(next_page, 1);
  batch.fp8_pool = {nullptr, batch.pool_pages,
                    Fp8PageLayout{shape.page_size, shape.dv, shape.dk - shape.dv}};
  const std::vector<const Bf16*> queries(shape.seqlens.size(), nullptr);
  RETURN_IF_ERROR(l->Lower(device, std::move(batch), shape.sq, shape.causal, shape.seqlens, queries,
                           options, /*backed=*/false, shape.kv_dtype));
  return l;
}

absl::Status LatentDecodeLaunch::Lower(Device& device, DecodeBatch batch, int sq, bool causal,
                                       std::span<const int32_t> lengths,
                                       std::span<const Bf16* const> queries,
                                       const AttentionDeviceKernelOptions& options, bool backed,
                                       KvDtype kv_dtype) {
  DecodeBatch::Group group;
  group.kv_dtype = kv_dtype;
  group.head_space = false;
  group.sq = sq;
  group.causal = causal;
  for (size_t m = 0; m < pages_.size(); ++m) {
    group.members.push_back(
        DecodeBatch::Member{pages_[m], lengths[m], nullptr, nullptr, queries[m]});
  }
  batch.groups.push_back(std::move(group));
  batch.algorithm = options.algorithm;
  ASSIGN_OR_RETURN(built_, BuildBatchSteps(batch));
  ASSIGN_OR_RETURN(launch_, BatchLaunch::Create(device, built_.steps, options, backed));
  return absl::OkStatus();
}

const DeviceKernel* LatentDecodeLaunch::kernel() const {
  for (const auto& k : launch_->kernels()) {
    if (dynamic_cast<const AttentionDeviceKernel*>(k.get()) != nullptr) return k.get();
  }
  return nullptr;
}

AttentionOutput LatentDecodeLaunch::ReadOutput() const {
  AttentionOutput output;
  for (const AnswerRef& a : built_.answers[0]) {
    const std::span<const float> out = launch_->Elements<float>(a.out, a.out_elements);
    const std::span<const float> lse = launch_->Elements<float>(a.lse, a.lse_elements);
    output.out.insert(output.out.end(), out.begin(), out.end());
    output.lse.insert(output.lse.end(), lse.begin(), lse.end());
  }
  return output;
}

absl::StatusOr<DeviceDecodeResult> RunLatentDecodeOnDevice(
    Device& device, const LatentDecodeProblem& problem, const AttentionDeviceKernelOptions& options,
    int parallel_units) {
  ASSIGN_OR_RETURN(auto launch,
                   LatentDecodeLaunch::Prepare(device, problem, options, parallel_units));
  ASSIGN_OR_RETURN(BatchLaunchReport report, launch->launch().Run(ExecutionMode::kExecute));
  return DeviceDecodeResult{launch->ReadOutput(), Summarize(report, device.profile())};
}

absl::StatusOr<DeviceDecodeResult> RunFp8LatentDecodeOnDevice(
    Device& device, const Fp8LatentDecodeProblem& problem,
    const AttentionDeviceKernelOptions& options, int parallel_units) {
  ASSIGN_OR_RETURN(auto launch,
                   LatentDecodeLaunch::PrepareFp8(device, problem, options, parallel_units));
  ASSIGN_OR_RETURN(BatchLaunchReport report, launch->launch().Run(ExecutionMode::kExecute));
  return DeviceDecodeResult{launch->ReadOutput(), Summarize(report, device.profile())};
}

absl::StatusOr<LaunchReport> ModelLatentDecodeOnDevice(Device& device,
                                                       const LatentDecodeShape& shape,
                                                       const AttentionDeviceKernelOptions& options,
                                                       int parallel_units) {
  ASSIGN_OR_RETURN(auto launch,
                   LatentDecodeLaunch::PrepareModel(device, shape, options, parallel_units));
  ASSIGN_OR_RETURN(BatchLaunchReport report, launch->launch().Run(ExecutionMode::kModelOnly));
  return Summarize(report, device.profile());
}

}  // namespace mlaserve::npu
