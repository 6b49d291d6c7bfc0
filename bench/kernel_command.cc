#include "bench/kernel_command.h"

#include "bench/host_description.h"
#include "kernels/core/cpu_features.h"

#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"
#include "bench/sgemm_baseline.h"
#include "common/status_macros.h"
#include "kernels/core/fp8_paged_kv_cache.h"
#include "kernels/core/matmul.h"
#include "kernels/core/random_fill.h"
#include "kernels/npu/device.h"
#include "kernels/npu/programs/latent_decode_on_device.h"
#include "nlohmann/json.hpp"

namespace mlaserve::bench {
namespace {

constexpr int kDk = 576;
constexpr int kDv = 512;

// A kernel and the cache it reads: snap is SnapMLA over AMLA on the FP8 cache.
struct KernelChoice {
  RescaleAlgorithm algorithm;
  KvDtype kv_dtype;
};

absl::StatusOr<KernelChoice> ParseKernel(const std::string& name) {
  if (name == "amla") return KernelChoice{RescaleAlgorithm::kAmla, KvDtype::kBf16};
  if (name == "base") return KernelChoice{RescaleAlgorithm::kBase, KvDtype::kBf16};
  if (name == "snap") return KernelChoice{RescaleAlgorithm::kAmla, KvDtype::kFp8};
  return absl::InvalidArgumentError(
      absl::StrCat("--kernel: unknown kernel '", name, "' (amla, base, snap)"));
}

// A dense random batch: every request has `sk` cached tokens in its own run of pages.
struct Batch {
  std::vector<Bf16> q, pages;
  std::vector<int32_t> table, seqlens;
  int pages_per_seq = 0;
};

Batch MakeBatch(int batch, int sq, int heads, int sk, int page_size) {
  Batch b;
  Rng rng(42);
  b.pages_per_seq = (sk + page_size - 1) / page_size;
  b.q.resize(static_cast<size_t>(batch) * sq * heads * kDk);
  b.pages.resize(static_cast<size_t>(batch) * b.pages_per_seq * page_size * kDk);
  FillNormal(b.q, 1.0, rng);
  FillNormal(b.pages, 1.0, rng);
  b.table.resize(static_cast<size_t>(batch) * b.pages_per_seq);
  std::iota(b.table.begin(), b.table.end(), 0);
  b.seqlens.assign(batch, sk);
  return b;
}

}  // namespace

absl::Status RunKernelCommand(const KernelCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(npu::DeviceProfile profile, npu::LoadDeviceProfile(o.profile));
  ASSIGN_OR_RETURN(auto device, npu::Device::Create(profile, {.host_threads = o.host_threads}));
  if (!o.json) {
    out << absl::StrFormat(
        "decode attention on %s (%d AIC, %.1f TFLOPS peak, %.2f TB/s): batch=%d heads=%d "
        "preload=%d%s%s\n",
        profile.name, profile.cube_cores, profile.PeakFlops() / 1e12,
        profile.HbmBytesPerSecond() / 1e12, o.batch, o.heads, o.preload,
        o.split_kv ? ", split-KV (attention + merge launches)" : "",
        o.model_only ? " (model only)" : "");
    if (!o.model_only) {
      out << absl::StrFormat("%s; %d host threads, baseline %s\n", HostDescription(),
                             o.host_threads, SgemmBaselineName());
    }
    // rec_ms and sim_ms are the emulator's own host overhead per launch (recording plus
    // checks, and the timing model), beside host_ms, the execution of the payloads.
    out << absl::StrFormat("%-5s %3s %6s %11s %6s %6s %8s %6s %8s %9s %9s %10s %6s %8s %8s\n",
                           "kernel", "sq", "sk", "modeled_us", "FU%", "AIC.M", "AIC.MTE2", "AIV.V",
                           "AIV.MTE2", "host_ms", "host_GF/s", "sgemm_GF/s", "ratio", "rec_ms",
                           "sim_ms");
  }
  const int units = o.split_kv ? profile.cube_cores : 1;
  for (int sq : o.sq) {
    for (int sk : o.sk) {
      Batch data;
      if (!o.model_only) data = MakeBatch(o.batch, sq, o.heads, sk, o.page_size);
      for (const std::string& name : o.kernels) {
        ASSIGN_OR_RETURN(const KernelChoice kernel, ParseKernel(name));
        const bool fp8 = kernel.kv_dtype == KvDtype::kFp8;
        const npu::AttentionDeviceKernelOptions options{
            .algorithm = kernel.algorithm, .preload = o.preload, .amla = {}};
        npu::LaunchReport report;
        double sgemm_gflops = 0;
        if (o.model_only) {
          ASSIGN_OR_RETURN(
              report, npu::ModelLatentDecodeOnDevice(*device,
                                                     {.heads = o.heads,
                                                      .sq = sq,
                                                      .seqlens = std::vector<int32_t>(o.batch, sk),
                                                      .dk = kDk,
                                                      .dv = kDv,
                                                      .page_size = o.page_size,
                                                      .causal = true,
                                                      .kv_dtype = kernel.kv_dtype},
                                                     options, units));
        } else {
          ASSIGN_OR_RETURN(
              auto q, (TensorView<const Bf16, 4>::Create(data.q, {o.batch, sq, o.heads, kDk})));
          ASSIGN_OR_RETURN(auto pages,
                           (TensorView<const Bf16, 3>::Create(
                               data.pages, {o.batch * data.pages_per_seq, o.page_size, kDk})));
          ASSIGN_OR_RETURN(auto table, (TensorView<const int32_t, 2>::Create(
                                           data.table, {o.batch, data.pages_per_seq})));
          const LatentDecodeProblem problem{q,
                                            PagedKvCache{pages},
                                            PagedSequences{table, data.seqlens},
                                            kDv,
                                            static_cast<float>(1.0 / std::sqrt(192.0)),
                                            true};
          std::vector<std::byte> fp8_pages;
          if (fp8) fp8_pages = QuantizePagedCache(problem.cache, kDv);
          const Fp8LatentDecodeProblem fp8_problem{
              q,
              Fp8PagedKvCache{fp8_pages.data(), problem.cache.num_pages(),
                              Fp8PageLayout{o.page_size, kDv, kDk - kDv}},
              problem.seqs, problem.softmax_scale, true};
          // Shared machines are noisy: the kernel and the SGEMM baseline alternate, and each
          // keeps its best of `repeats` runs.
          double sgemm_best = 0;
          for (int r = 0; r < std::max(1, o.repeats); ++r) {
            ASSIGN_OR_RETURN(
                auto result,
                fp8 ? npu::RunFp8LatentDecodeOnDevice(*device, fp8_problem, options, units)
                    : npu::RunLatentDecodeOnDevice(*device, problem, options, units));
            if (r == 0 || *result.report.host_ms < *report.host_ms)
              report = std::move(result.report);
            sgemm_best = std::max(sgemm_best,
                                  MeasureSgemmBaselineGflops(report.mmad_shapes, o.host_threads));
          }
          sgemm_gflops = sgemm_best;
        }
        const double host_gflops = report.host_ms ? report.flops / (*report.host_ms * 1e6) : 0.0;
        if (o.json) {
          nlohmann::json row = {{"kernel", name},
                                {"profile", profile.name},
                                {"batch", o.batch},
                                {"heads", o.heads},
                                {"sq", sq},
                                {"sk", sk},
                                {"preload", o.preload},
                                {"split_kv", o.split_kv},
                                {"modeled_us", report.modeled_us},
                                {"fu", report.fu},
                                {"flops", report.flops},
                                {"pipe_busy", report.pipe_busy},
                                {"gm_read_bytes", report.gm_read_bytes},
                                {"hbm_read_bytes", report.hbm_read_bytes},
                                {"host_record_ms", report.host_record_ms},
                                {"host_model_ms", report.host_model_ms}};
          if (report.host_ms) {
            row["host_ms"] = *report.host_ms;
            row["host_gflops"] = host_gflops;
            row["host_sgemm_gflops"] = sgemm_gflops;
            row["matrix_unit"] = MatrixUnitBackend();
            row["cpu"] = HostCpu().model;
            row["isa"] = HostCpu().MatrixIsa();
            row["sgemm_baseline"] = SgemmBaselineName();
          }
          out << row.dump() << "\n";
        } else {
          auto busy = [&](const char* pipe) { return 100.0 * report.pipe_busy[pipe]; };
          out << absl::StrFormat("%-6s %3d %6d %11.1f %6.1f %6.1f %8.1f %6.1f %8.1f ", name, sq, sk,
                                 report.modeled_us, 100.0 * report.fu, busy("AIC.M"),
                                 busy("AIC.MTE2"), busy("AIV.V"), busy("AIV.MTE2"));
          if (report.host_ms) {
            out << absl::StrFormat("%9.1f %9.1f %10.1f %6.3f ", *report.host_ms, host_gflops,
                                   sgemm_gflops, host_gflops / sgemm_gflops);
          } else {
            out << absl::StrFormat("%9s %9s %10s %6s ", "-", "-", "-", "-");
          }
          out << absl::StrFormat("%8.2f %8.2f\n", report.host_record_ms, report.host_model_ms);
        }
        out.flush();
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
