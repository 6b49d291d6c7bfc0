#include "bench/gpu_host_path_command.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/host_description.h"
#include "client/loadgen/load_report.h"
#include "common/status_macros.h"
#include "kernels/core/random_fill.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/gpu/gpu_lowering.h"
#include "kernels/gpu/open_gpu.h"
#include "kernels/mla/batch_step_builder.h"

#if MLASERVE_HAVE_CUDA
#include "kernels/cuda/cuda_runtime.h"
#endif

namespace mlaserve::bench {

#if MLASERVE_HAVE_CUDA
namespace {

constexpr int kLatent = 512;
constexpr int kRope = 64;
constexpr int kKey = kLatent + kRope;
constexpr int kNope = 128;
constexpr int kValue = 128;
constexpr int kPage = 64;  // FlashMLA's block size, the GPU server's page

struct Variant {
  const char* name;
  cuda::CudaOptions options;
  // The queries' host memory mapped into the GPU (as a data plane's region is): the copy
  // launch reads them in place instead of the lowering copying them into the upload.
  bool map_queries = false;
};

// Page-aligned host memory for a batch's queries (what cudaHostRegister pins whole).
struct PageAligned {
  void operator()(Bf16* p) const { std::free(p); }
};
std::unique_ptr<Bf16[], PageAligned> AllocatePages(size_t elements) {
  const size_t bytes = (elements * sizeof(Bf16) + 4095) / 4096 * 4096;
  return std::unique_ptr<Bf16[], PageAligned>(static_cast<Bf16*>(std::aligned_alloc(4096, bytes)));
}

// One runtime with the batch's inputs resident: the pool and kv_b_proj.
struct Prepared {
  std::unique_ptr<cuda::CudaRuntime> runtime;
  std::unique_ptr<gpu::GpuBatchExecutor> executor;
  gpu::DevicePtr pool = 0;
  gpu::DevicePtr kv_b = 0;
  std::vector<double> kernel_us;
  std::vector<double> copies_us;  // upload and download, on the device's clock
  std::vector<double> lowering_us;
  std::vector<double> wall_us;
};

}  // namespace

absl::Status RunGpuHostPathCommand(const GpuHostPathCommandOptions& o, std::ostream& out) {
  int ordinal = -1;
  if (!gpu::IsGpuName(o.device) || o.device.rfind("cuda:", 0) != 0 ||
      !absl::SimpleAtoi(o.device.substr(5), &ordinal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: hostpath runs on a CUDA GPU (cuda:N), not '", o.device, "'"));
  }
  const std::vector<Variant> variants = {
      {"tiled GEMM, enqueued", {.row_kernel = false, .graphs = 0}},
      {"row kernel, enqueued", {.row_kernel = true, .graphs = 0}},
      {"tiled GEMM, graphs", {.row_kernel = false}},
      {"row kernel, graphs", {.row_kernel = true}},
      {"row kernel, graphs, mapped", {.row_kernel = true}, true},
  };
  const int max_batch = *std::max_element(o.batch.begin(), o.batch.end());
  const int pages_per_seq = (o.keys + kPage - 1) / kPage;
  const int64_t pool_pages = int64_t{max_batch} * pages_per_seq;
  Rng rng(11);
  std::vector<Bf16> pool_host(static_cast<size_t>(pool_pages) * kPage * kKey);
  FillNormal(pool_host, 0.1, rng);
  std::vector<Bf16> kv_b_host(static_cast<size_t>(o.heads) * (kNope + kValue) * kLatent);
  FillNormal(kv_b_host, 0.05, rng);

  std::vector<Prepared> runs(variants.size());
  for (size_t v = 0; v < variants.size(); ++v) {
    Prepared& p = runs[v];
    ASSIGN_OR_RETURN(p.runtime, cuda::CudaRuntime::Create(ordinal, variants[v].options));
    ASSIGN_OR_RETURN(p.pool,
                     p.runtime->Allocate(static_cast<int64_t>(pool_host.size()) * 2, "pool"));
    RETURN_IF_ERROR(p.runtime->CopyToDevice(p.pool, pool_host.data(),
                                            static_cast<int64_t>(pool_host.size()) * 2));
    ASSIGN_OR_RETURN(p.kv_b,
                     p.runtime->Allocate(static_cast<int64_t>(kv_b_host.size()) * 2, "kv_b"));
    RETURN_IF_ERROR(p.runtime->CopyToDevice(p.kv_b, kv_b_host.data(),
                                            static_cast<int64_t>(kv_b_host.size()) * 2));
    p.executor = std::make_unique<gpu::GpuBatchExecutor>(*p.runtime);
  }
  const gpu::DeviceProperties& props = runs[0].runtime->properties();
  out << absl::StrFormat("mlaserve-bench hostpath on %s\n%s\n", gpu::DescribeGpu(props),
                         HostDescription());
  out << absl::StrFormat(
      "a decode step in head space: B sequences of %d keys, %d heads, sq 1, %d-token pages, "
      "bf16 cache and answers; %d rounds alternating the variants, %d runs each after 3 "
      "warm-up runs; medians\n",
      o.keys, o.heads, kPage, o.rounds, o.repeats);
  out << absl::StrFormat("%5s  %-28s %11s %10s %11s %11s %9s\n", "B", "variant", "kernels us",
                         "copies us", "lowering us", "wall us", "launches");

  std::vector<int32_t> table(static_cast<size_t>(pool_pages));
  std::iota(table.begin(), table.end(), 0);
  for (int b : o.batch) {
    const size_t nope_elements = static_cast<size_t>(b) * o.heads * kNope;
    const size_t pe_elements = static_cast<size_t>(b) * o.heads * kRope;
    auto q_nope = AllocatePages(nope_elements);
    auto q_pe = AllocatePages(pe_elements);
    FillNormal(std::span<Bf16>(q_nope.get(), nope_elements), 1.0, rng);
    FillNormal(std::span<Bf16>(q_pe.get(), pe_elements), 1.0, rng);
    std::vector<std::shared_ptr<void>> mappings;
    for (size_t v = 0; v < variants.size(); ++v) {
      if (!variants[v].map_queries) continue;
      for (const auto& [data, elements] :
           {std::pair{q_nope.get(), nope_elements}, std::pair{q_pe.get(), pe_elements}}) {
        ASSIGN_OR_RETURN(std::shared_ptr<void> mapping,
                         runs[v].runtime->MapHost(data, static_cast<int64_t>(elements) * 2));
        mappings.push_back(std::move(mapping));
      }
    }
    DecodeBatch batch;
    batch.dims = {o.heads, kNope, kRope, kLatent, kValue, 1.0f / 13.856406f};
    batch.parallel_units = props.sm_count;
    gpu::UseGpuSplit(batch, props);
    DecodeBatch::Group group;
    group.head_space = true;
    group.sq = 1;
    group.out_bf16 = true;
    group.kv_b = kv_b_host.data();
    for (int s = 0; s < b; ++s) {
      DecodeBatch::Member m;
      m.pages = std::span<const int32_t>(table).subspan(static_cast<size_t>(s) * pages_per_seq,
                                                        pages_per_seq);
      m.length = o.keys;
      m.q_nope = q_nope.get() + static_cast<size_t>(s) * o.heads * kNope;
      m.q_pe = q_pe.get() + static_cast<size_t>(s) * o.heads * kRope;
      group.members.push_back(m);
    }
    batch.groups.push_back(std::move(group));
    batch.pool = pool_host.data();
    batch.pool_pages = pool_pages;
    batch.page_size = kPage;
    ASSIGN_OR_RETURN(BuiltBatch built, BuildBatchSteps(batch));
    int launches = 0;
    for (Prepared& p : runs) {
      p.kernel_us.clear();
      p.copies_us.clear();
      p.lowering_us.clear();
      p.wall_us.clear();
    }
    for (int round = 0; round < o.rounds; ++round) {
      for (Prepared& p : runs) {
        const gpu::InputResolver resolve =
            [&](const StepBuffer& buffer) -> absl::StatusOr<gpu::DevicePtr> {
          if (buffer.input == kv_b_host.data()) return p.kv_b;
          if (buffer.input == pool_host.data()) return p.pool;
          return absl::NotFoundError(absl::StrCat("no device copy of '", buffer.name, "'"));
        };
        for (int r = 0; r < o.repeats + 3; ++r) {
          const auto start = std::chrono::steady_clock::now();
          ASSIGN_OR_RETURN(gpu::GpuBatchExecutor::Result result,
                           p.executor->Run(built.steps, resolve));
          const double wall =
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count();
          if (r < 3) continue;
          p.kernel_us.push_back(result.timing.kernels_ms * 1e3);
          p.copies_us.push_back((result.timing.upload_ms + result.timing.download_ms) * 1e3);
          p.lowering_us.push_back(result.lowering_us);
          p.wall_us.push_back(wall);
          launches = result.launches;
        }
      }
    }
    for (size_t v = 0; v < variants.size(); ++v) {
      out << absl::StrFormat("%5d  %-28s %11.1f %10.1f %11.1f %11.1f %9d\n", b, variants[v].name,
                             loadgen::PercentilesOf(runs[v].kernel_us).p50,
                             loadgen::PercentilesOf(runs[v].copies_us).p50,
                             loadgen::PercentilesOf(runs[v].lowering_us).p50,
                             loadgen::PercentilesOf(runs[v].wall_us).p50, launches);
    }
  }
  for (Prepared& p : runs) {
    p.executor.reset();
    p.runtime->Free(p.pool);
    p.runtime->Free(p.kv_b);
  }
  return absl::OkStatus();
}

#else

absl::Status RunGpuHostPathCommand(const GpuHostPathCommandOptions&, std::ostream&) {
  return absl::UnimplementedError(
      "hostpath: this build has no CUDA device (configure with -DMLASERVE_CUDA=ON)");
}

#endif

}  // namespace mlaserve::bench
