#include "bench/typhoon_command.h"

#include "bench/typhoon_batch.h"

#include "bench/host_description.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/core/random_fill.h"
#include "kernels/mla/batch_step_builder.h"
#include "kernels/npu/device.h"
#include "kernels/npu/programs/batch_launch.h"
#include "nlohmann/json.hpp"
#include "server/engine/kv/expanded_kv.h"
#include "server/engine/model/model_config.h"
#include "server/engine/model/model_weights.h"
#include "server/engine/plan/planner.h"

namespace mlaserve::bench {
namespace {

using engine::ModelConfig;

struct Timed {
  npu::BatchLaunchReport report;
  std::optional<double> host_ms;
  std::vector<float> out;
};

absl::StatusOr<Timed> RunOnce(npu::Device& device, const DecodeBatch& batch,
                              const npu::AttentionDeviceKernelOptions& kernel, bool execute) {
  ASSIGN_OR_RETURN(BuiltBatch built, BuildBatchSteps(batch));
  ASSIGN_OR_RETURN(auto launch, npu::BatchLaunch::Create(device, built.steps, kernel, execute));
  Timed t;
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(t.report, launch->Run(execute ? npu::ExecutionMode::kExecute
                                                 : npu::ExecutionMode::kModelOnly));
  if (execute) {
    t.host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    for (const AnswerRef& a : built.answers[0]) {
      const std::span<const float> out = launch->Elements<float>(a.out, a.out_elements);
      t.out.insert(t.out.end(), out.begin(), out.end());
    }
  }
  return t;
}

// sqrt(sum (a - b)^2 / sum b^2)
double RelativeRmsDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    den += double{b[i]} * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

nlohmann::json LaunchTimes(const npu::BatchLaunchReport& report) {
  nlohmann::json launches = nlohmann::json::array();
  for (const npu::LaunchReport& l : report.launches) {
    launches.push_back({{"kernel", l.kernel},
                        {"modeled_us", l.modeled_us},
                        {"fu", l.fu},
                        {"pipe_busy", l.pipe_busy},
                        {"hbm_read_bytes", l.hbm_read_bytes},
                        {"gm_read_bytes", l.gm_read_bytes}});
  }
  return launches;
}

}  // namespace

absl::Status RunTyphoonCommand(const TyphoonCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(ModelConfig m, engine::PresetModelConfig(o.model, {.layers = 1}));
  if (o.shared < 1 || o.suffix < 1 || o.page_size < 1 || o.batch.empty() || o.sq.empty()) {
    return absl::InvalidArgumentError(
        "--shared, --suffix and --page-size must be >= 1, --batch and --sq non-empty");
  }
  ASSIGN_OR_RETURN(npu::DeviceProfile profile, npu::LoadDeviceProfile(o.profile));
  ASSIGN_OR_RETURN(auto device, npu::Device::Create(profile, {.host_threads = o.host_threads}));
  const engine::DeviceRates rates{
      (o.matrix_tflops > 0 ? o.matrix_tflops * 1e12 : profile.PeakFlops()),
      (o.hbm_tbps > 0 ? o.hbm_tbps * 1e12 : profile.HbmBytesPerSecond())};
  const npu::AttentionDeviceKernelOptions kernel{
      .algorithm = RescaleAlgorithm::kAmla, .preload = o.preload, .amla = {}};
  const bool execute = !o.model_only;
  const int max_batch = *std::max_element(o.batch.begin(), o.batch.end());
  const int max_sq = *std::max_element(o.sq.begin(), o.sq.end());
  const PageLayout layout(o.page_size, o.shared, o.suffix, max_batch);
  const int units = profile.cube_cores;  // what the engine's planner gives an attention launch

  std::optional<HostData> host;
  if (execute) {
    ASSIGN_OR_RETURN(HostData data, MakeHostData(m, layout, o.shared, max_sq));
    host.emplace(std::move(data));
  }
  std::vector<std::vector<int32_t>> pages;
  for (int member = 0; member < max_batch; ++member) pages.push_back(layout.PagesOf(member));

  if (!o.json) {
    out << absl::StrFormat(
        "TyphoonMLA on %s: %s (H=%d), shared Ls=%d, suffix Ln=%d; rates for B_theta: %.1f TFLOPS, "
        "%.2f TB/s%s\n",
        profile.name, m.name, m.heads, o.shared, o.suffix, rates.matrix_flops / 1e12,
        rates.memory_bytes_per_second / 1e12, execute ? "" : " (model only)");
    out << HostDescription() << "\n";
    out << absl::StrFormat("%3s %5s %7s %7s %11s %11s %7s %8s %11s %11s %7s %9s\n", "sq", "B",
                           "B_theta", "choice", "absorb_us", "hybrid_us", "speedup", "typhoon",
                           "host_abs_ms", "host_hyb_ms", "host_x", "rel_diff");
  }
  for (int sq : o.sq) {
    const double b_theta = engine::TyphoonBatchThreshold(m, sq, rates);
    for (int batch : o.batch) {
      const char* choice = batch >= b_theta ? "hybrid" : "absorb";
      const HostData* h = host ? &*host : nullptr;
      ASSIGN_OR_RETURN(Timed absorb,
                       RunOnce(*device, MakeBatch(o, m, sq, batch, false, layout, pages, h, units),
                               kernel, execute));
      ASSIGN_OR_RETURN(Timed hybrid,
                       RunOnce(*device, MakeBatch(o, m, sq, batch, true, layout, pages, h, units),
                               kernel, execute));
      const double speedup = absorb.report.modeled_us / hybrid.report.modeled_us;
      // What the planner's choice gains over absorb-only: the fallback makes it 1 below B_theta.
      const double typhoon = batch >= b_theta ? speedup : 1.0;
      if (o.json) {
        nlohmann::json row = {{"model", m.name},
                              {"profile", profile.name},
                              {"sq", sq},
                              {"shared", o.shared},
                              {"suffix", o.suffix},
                              {"batch", batch},
                              {"b_theta", b_theta},
                              {"choice", choice},
                              {"absorb_us", absorb.report.modeled_us},
                              {"hybrid_us", hybrid.report.modeled_us},
                              {"speedup", speedup},
                              {"typhoon_speedup", typhoon},
                              {"absorb_launches", LaunchTimes(absorb.report)},
                              {"hybrid_launches", LaunchTimes(hybrid.report)}};
        if (execute) {
          row["host_absorb_ms"] = *absorb.host_ms;
          row["host_hybrid_ms"] = *hybrid.host_ms;
          row["host_speedup"] = *absorb.host_ms / *hybrid.host_ms;
          row["rel_rms_diff"] = RelativeRmsDifference(hybrid.out, absorb.out);
        }
        out << row.dump() << "\n";
      } else {
        out << absl::StrFormat("%3d %5d %7.1f %7s %11.1f %11.1f %7.2f %8.2f ", sq, batch, b_theta,
                               choice, absorb.report.modeled_us, hybrid.report.modeled_us, speedup,
                               typhoon);
        if (execute) {
          out << absl::StrFormat("%11.1f %11.1f %7.2f %9.2e\n", *absorb.host_ms, *hybrid.host_ms,
                                 *absorb.host_ms / *hybrid.host_ms,
                                 RelativeRmsDifference(hybrid.out, absorb.out));
        } else {
          out << absl::StrFormat("%11s %11s %7s %9s\n", "-", "-", "-", "-");
        }
      }
      out.flush();
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
