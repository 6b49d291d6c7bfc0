#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/gpu_resident_inputs.h"
#include "bench/host_description.h"
#include "bench/typhoon_batch.h"
#include "bench/typhoon_command.h"
#include "common/status_macros.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/gpu/gpu_lowering.h"
#include "kernels/gpu/open_gpu.h"
#include "kernels/mla/batch_step_builder.h"
#include "nlohmann/json.hpp"
#include "server/engine/plan/planner.h"

namespace mlaserve::bench {

engine::DeviceRates GpuTyphoonRates(const gpu::DeviceProperties& props,
                                    const TyphoonCommandOptions& o) {
  // The engine's rates for this device (engine_impl.cc): what its kernels attain.
  const double device_tflops = props.absorb_tflops > 0 ? props.absorb_tflops : props.bf16_tflops;
  return {(o.matrix_tflops > 0 ? o.matrix_tflops : device_tflops) * 1e12,
          (o.hbm_tbps > 0 ? o.hbm_tbps : props.hbm_tbps) * 1e12, 0, props.naive_tflops * 1e12};
}

absl::Status RunGpuTyphoonCommand(const TyphoonCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(engine::ModelConfig m, engine::PresetModelConfig(o.model, {.layers = 1}));
  if (o.shared < 1 || o.suffix < 1 || o.page_size < 1 || o.batch.empty() || o.sq.empty() ||
      o.repeats < 1) {
    return absl::InvalidArgumentError(
        "--shared, --suffix, --page-size and --repeats must be >= 1, --batch and --sq non-empty");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::GpuRuntime> runtime, gpu::OpenGpu(o.device));
  const gpu::DeviceProperties& props = runtime->properties();
  const engine::DeviceRates rates = GpuTyphoonRates(props, o);
  const int max_batch = *std::max_element(o.batch.begin(), o.batch.end());
  const int max_sq = *std::max_element(o.sq.begin(), o.sq.end());
  const PageLayout layout(o.page_size, o.shared, o.suffix, max_batch);
  ASSIGN_OR_RETURN(HostData host, MakeHostData(m, layout, o.shared, max_sq));
  ResidentInputs inputs(*runtime);
  RETURN_IF_ERROR(AddTyphoonInputs(inputs, host));
  std::vector<std::vector<int32_t>> pages;
  for (int member = 0; member < max_batch; ++member) pages.push_back(layout.PagesOf(member));

  if (!o.json) {
    out << absl::StrFormat(
        "TyphoonMLA on %s: %s (H=%d), shared Ls=%d, suffix Ln=%d, %d-token pages; rates for "
        "B_theta: absorb %.0f TFLOPS, naive %.0f TFLOPS, %.2f TB/s; device time, median of %d "
        "runs\n%s\n",
        gpu::DescribeGpu(props), m.name, m.heads, o.shared, o.suffix, o.page_size,
        rates.matrix_flops / 1e12, rates.naive_matrix_flops / 1e12,
        rates.memory_bytes_per_second / 1e12, o.repeats, HostDescription());
    out << absl::StrFormat("%3s %5s %7s %7s %11s %11s %7s %8s %9s %10s %9s %9s\n", "sq", "B",
                           "B_theta", "choice", "absorb_us", "hybrid_us", "speedup", "typhoon",
                           "rel_diff", "naive_us", "absorb_TF", "naive_TF");
  }
  gpu::GpuBatchExecutor executor(*runtime);
  for (int sq : o.sq) {
    const double b_theta = engine::TyphoonBatchThreshold(m, sq, rates);
    for (int batch : o.batch) {
      ASSIGN_OR_RETURN(GpuTimed absorb, TimeOnGpu(executor, props,
                                                  MakeBatch(o, m, sq, batch, false, layout, pages,
                                                            &host, props.sm_count),
                                                  inputs, o.repeats));
      ASSIGN_OR_RETURN(GpuTimed hybrid, TimeOnGpu(executor, props,
                                                  MakeBatch(o, m, sq, batch, true, layout, pages,
                                                            &host, props.sm_count),
                                                  inputs, o.repeats));
      // The naive pass alone (every query ending with the prefix: an absorb pass over no
      // keys), for the rates the planner's B_theta takes.
      TyphoonCommandOptions prefix_only = o;
      prefix_only.suffix = 0;
      ASSIGN_OR_RETURN(GpuTimed naive, TimeOnGpu(executor, props,
                                                 MakeBatch(prefix_only, m, sq, batch, true, layout,
                                                           pages, &host, props.sm_count),
                                                 inputs, o.repeats));
      const double rows = static_cast<double>(batch) * sq * m.heads;
      const double absorb_tflops =
          2.0 * rows * (o.shared + o.suffix) * (2.0 * m.dl + m.dr) / (absorb.MedianUs() * 1e6);
      const double naive_tflops =
          2.0 * rows * o.shared * (m.dqk() + m.dv) / (naive.MedianUs() * 1e6);
      const double speedup = absorb.MedianUs() / hybrid.MedianUs();
      const double typhoon = batch >= b_theta ? speedup : 1.0;
      const double diff = RelativeRms(hybrid.out, absorb.out);
      if (o.json) {
        out << nlohmann::json{{"device", gpu::DescribeGpu(props)},
                              {"sq", sq},
                              {"shared", o.shared},
                              {"suffix", o.suffix},
                              {"batch", batch},
                              {"b_theta", b_theta},
                              {"absorb_us", absorb.MedianUs()},
                              {"hybrid_us", hybrid.MedianUs()},
                              {"speedup", speedup},
                              {"typhoon_speedup", typhoon},
                              {"rel_rms_diff", diff},
                              {"naive_us", naive.MedianUs()},
                              {"absorb_tflops", absorb_tflops},
                              {"naive_tflops", naive_tflops}}
                   .dump()
            << "\n";
      } else {
        out << absl::StrFormat(
            "%3d %5d %7.1f %7s %11.1f %11.1f %7.2f %8.2f %9.2e %10.1f %9.0f %9.0f\n", sq, batch,
            b_theta, batch >= b_theta ? "hybrid" : "absorb", absorb.MedianUs(), hybrid.MedianUs(),
            speedup, typhoon, diff, naive.MedianUs(), absorb_tflops, naive_tflops);
      }
      out.flush();
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
