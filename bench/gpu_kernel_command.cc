#include "bench/gpu_kernel_command.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/gpu_resident_inputs.h"
#include "bench/host_description.h"
#include "bench/latent_decode_batch.h"
#include "common/status_macros.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/random_fill.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/gpu/gpu_lowering.h"
#include "kernels/gpu/open_gpu.h"
#include "kernels/mla/batch_step_builder.h"
#include "nlohmann/json.hpp"

namespace mlaserve::bench {
absl::Status RunGpuKernelCommand(const GpuKernelCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::GpuRuntime> runtime, gpu::OpenGpu(o.device));
  const gpu::DeviceProperties& props = runtime->properties();
  const bool fp8 = o.kernel == "snap";
  if (!fp8 && o.kernel != "amla") {
    return absl::InvalidArgumentError(
        absl::StrCat("--kernel: '", o.kernel, "' has no GPU kernel (amla, snap)"));
  }
  const int max_sk = *std::max_element(o.sk.begin(), o.sk.end());
  const int pages_per_seq = (max_sk + o.page_size - 1) / o.page_size;
  const int64_t pool_pages = int64_t{o.batch} * pages_per_seq;
  const int64_t bf16_page_bytes = int64_t{o.page_size} * kKeyWidth * 2;

  // One pool in the cache's own format, on the device once, as the server keeps it.
  Rng rng(7);
  std::vector<Bf16> distinct(static_cast<size_t>(kDistinctPoolPages) * o.page_size * kKeyWidth);
  FillNormal(distinct, 0.1, rng);
  Fp8PageLayout layout{o.page_size, kLatentWidth, kRopeWidth, 0};
  std::vector<std::byte> distinct_bytes;
  if (fp8) {
    const PagedKvCache small{*TensorView<const Bf16, 3>::Create(
        std::span<const Bf16>(distinct), {kDistinctPoolPages, o.page_size, kKeyWidth})};
    distinct_bytes = QuantizePagedCache(small, kLatentWidth);
  } else {
    distinct_bytes.resize(distinct.size() * 2);
    std::memcpy(distinct_bytes.data(), distinct.data(), distinct_bytes.size());
  }
  const int64_t page_bytes = fp8 ? layout.stride() : bf16_page_bytes;
  // Host addresses only name the pool: the resolver hands the device's copy.
  static const Bf16 kNamesThePool{};
  ResidentInputs inputs(*runtime);
  RETURN_IF_ERROR(inputs.AddRepeated(
      &kNamesThePool, pool_pages * page_bytes,
      std::span(distinct_bytes).first(static_cast<size_t>(kDistinctPoolPages * page_bytes))));
  const NamedPool named_pool{&kNamesThePool, pool_pages, o.page_size, fp8, layout};

  std::vector<int32_t> table(static_cast<size_t>(pool_pages));
  std::iota(table.begin(), table.end(), 0);
  out << absl::StrFormat("mlaserve-bench kernel on %s\n%s\n", gpu::DescribeGpu(props),
                         HostDescription());
  out << absl::StrFormat(
      "decode attention, latent space (FlashMLA's problem): batch %d, %d heads, %d-token pages, "
      "%s cache, split-KV over %d SMs; median of %d runs (CUDA events around the launches)\n",
      o.batch, o.heads, o.page_size, fp8 ? "FP8 (SnapMLA)" : "bf16", props.sm_count, o.repeats);
  out << absl::StrFormat("%4s %7s %10s %10s %9s %8s", "sq", "sk", "time us", "TFLOP/s", "GB/s",
                         "launches");
  if (o.batch_invariant) out << absl::StrFormat(" %12s %10s", "invariant us", "inv/default");
  out << "\n";
  nlohmann::json rows = nlohmann::json::array();
  gpu::GpuBatchExecutor executor(*runtime);
  for (int sq : o.sq) {
    for (int sk : o.sk) {
      std::vector<Bf16> q(static_cast<size_t>(o.batch) * sq * o.heads * kKeyWidth);
      FillNormal(q, 1.0, rng);
      DecodeBatch batch = MakeLatentBatch(o.batch, o.heads, sq, sk, table, pages_per_seq, q.data(),
                                          named_pool, props.sm_count);
      gpu::UseGpuSplit(batch, props);
      ASSIGN_OR_RETURN(BuiltBatch built, BuildBatchSteps(batch));
      DecodeBatch invariant_batch = batch;
      invariant_batch.batch_invariant = true;
      invariant_batch.invariant_part_tokens = o.invariant_part_tokens;
      ASSIGN_OR_RETURN(BuiltBatch invariant, BuildBatchSteps(invariant_batch));
      const gpu::InputResolver resolve = inputs.resolver();
      std::vector<double> ms, invariant_ms;
      int launches = 0;
      for (int r = 0; r < o.repeats + 2; ++r) {  // two warm-up runs; the modes alternate
        {
          ASSIGN_OR_RETURN(gpu::GpuBatchExecutor::Result result,
                           executor.Run(built.steps, resolve));
          if (r >= 2) ms.push_back(result.timing.kernels_ms);
          launches = result.launches;
        }  // its answers' buffers go back to the executor before the next run
        if (!o.batch_invariant) continue;
        ASSIGN_OR_RETURN(gpu::GpuBatchExecutor::Result result,
                         executor.Run(invariant.steps, resolve));
        if (r >= 2) invariant_ms.push_back(result.timing.kernels_ms);
      }
      const double t = Median(ms) * 1e-3;
      const double t_invariant = Median(invariant_ms) * 1e-3;
      const double flops =
          2.0 * o.batch * sq * o.heads * static_cast<double>(sk) * (kKeyWidth + kLatentWidth);
      const double bytes =
          static_cast<double>(o.batch) * sk *
          (fp8 ? Fp8PageLayout::BytesPerToken(kLatentWidth, kRopeWidth) : kKeyWidth * 2);
      out << absl::StrFormat("%4d %7d %10.1f %10.1f %9.0f %8d", sq, sk, t * 1e6, flops / t / 1e12,
                             bytes / t / 1e9, launches);
      if (o.batch_invariant)
        out << absl::StrFormat(" %12.1f %10.3f", t_invariant * 1e6, t_invariant / t);
      out << "\n";
      nlohmann::json row = {{"sq", sq},
                            {"sk", sk},
                            {"us", t * 1e6},
                            {"tflops", flops / t / 1e12},
                            {"gbps", bytes / t / 1e9}};
      if (o.batch_invariant) row["invariant_us"] = t_invariant * 1e6;
      rows.push_back(std::move(row));
    }
  }
  if (o.json) {
    out << nlohmann::json{{"gpu", gpu::DescribeGpu(props)},
                          {"host", HostDescription()},
                          {"batch", o.batch},
                          {"heads", o.heads},
                          {"kernel", o.kernel},
                          {"rows", rows}}
               .dump()
        << "\n";
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
