#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_format.h"
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
namespace {

// Host arrays copied to the device once, as the server keeps its pool, weights and expansions
// there; a batch's input buffers resolve to them.
class DeviceCopies {
 public:
  explicit DeviceCopies(gpu::GpuRuntime& runtime) : runtime_(runtime) {}
  ~DeviceCopies() {
    for (const auto& [host, copy] : copies_) runtime_.Free(copy.first);
  }
  absl::Status Add(const void* host, int64_t bytes) {
    ASSIGN_OR_RETURN(const gpu::DevicePtr at, runtime_.Allocate(bytes, "bench input"));
    copies_[static_cast<const std::byte*>(host)] = {at, bytes};
    return runtime_.CopyToDevice(at, host, bytes);
  }
  gpu::InputResolver resolver() const {
    return [this](const StepBuffer& b) -> absl::StatusOr<gpu::DevicePtr> {
      const auto* p = static_cast<const std::byte*>(b.input);
      auto it = copies_.upper_bound(p);
      if (it != copies_.begin()) {
        --it;
        if (p + b.elements * ElementBytes(b.type) <= it->first + it->second.second) {
          return it->second.first + static_cast<gpu::DevicePtr>(p - it->first);
        }
      }
      return absl::NotFoundError("not copied to the device");
    };
  }

 private:
  gpu::GpuRuntime& runtime_;
  std::map<const std::byte*, std::pair<gpu::DevicePtr, int64_t>> copies_;
};

struct GpuTimed {
  double us = 0;  // median device time
  std::vector<float> out;
};

absl::StatusOr<GpuTimed> TimeOnGpu(gpu::GpuBatchExecutor& executor,
                                   const gpu::DeviceProperties& props, DecodeBatch batch,
                                   const DeviceCopies& inputs, int repeats) {
  gpu::UseGpuSplit(batch, props);
  ASSIGN_OR_RETURN(BuiltBatch built, BuildBatchSteps(batch));
  std::vector<double> us;
  GpuTimed t;
  for (int r = 0; r < repeats + 2; ++r) {  // two warm-up runs
    ASSIGN_OR_RETURN(gpu::GpuBatchExecutor::Result run,
                     executor.Run(built.steps, inputs.resolver()));
    if (r >= 2) us.push_back(run.timing.kernels_ms * 1e3);
    if (r + 1 == repeats + 2) {
      for (const AnswerRef& a : built.answers[0]) {
        const std::span<const float> out = run.buffers->Elements<float>(a.out, a.out_elements);
        t.out.assign(out.begin(), out.end());
      }
    }
  }
  std::sort(us.begin(), us.end());
  t.us = us[us.size() / 2];
  return t;
}

double RelativeRms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    den += double{b[i]} * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

}  // namespace

absl::Status RunGpuTyphoonCommand(const TyphoonCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(engine::ModelConfig m, engine::PresetModelConfig(o.model, {.layers = 1}));
  if (o.shared < 1 || o.suffix < 1 || o.page_size < 1 || o.batch.empty() || o.sq.empty() ||
      o.repeats < 1) {
    return absl::InvalidArgumentError(
        "--shared, --suffix, --page-size and --repeats must be >= 1, --batch and --sq non-empty");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::GpuRuntime> runtime, gpu::OpenGpu(o.device));
  const gpu::DeviceProperties& props = runtime->properties();
  // The engine's rates for this device (engine_impl.cc): what its kernels attain.
  const double device_tflops = props.absorb_tflops > 0 ? props.absorb_tflops : props.bf16_tflops;
  const engine::DeviceRates rates{(o.matrix_tflops > 0 ? o.matrix_tflops : device_tflops) * 1e12,
                                  (o.hbm_tbps > 0 ? o.hbm_tbps : props.hbm_tbps) * 1e12, 0,
                                  props.naive_tflops * 1e12};
  const int max_batch = *std::max_element(o.batch.begin(), o.batch.end());
  const int max_sq = *std::max_element(o.sq.begin(), o.sq.end());
  const PageLayout layout(o.page_size, o.shared, o.suffix, max_batch);
  ASSIGN_OR_RETURN(HostData host, MakeHostData(m, layout, o.shared, max_sq));
  DeviceCopies inputs(*runtime);
  RETURN_IF_ERROR(inputs.Add(host.pool.data(), static_cast<int64_t>(host.pool.size()) * 2));
  const std::span<const Bf16> kv_b = host.weights->KvBProj(0);
  RETURN_IF_ERROR(inputs.Add(kv_b.data(), static_cast<int64_t>(kv_b.size()) * 2));
  RETURN_IF_ERROR(
      inputs.Add(host.level->keys().data(), static_cast<int64_t>(host.level->keys().size()) * 2));
  RETURN_IF_ERROR(inputs.Add(host.level->values().data(),
                             static_cast<int64_t>(host.level->values().size()) * 2));
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
          2.0 * rows * (o.shared + o.suffix) * (2.0 * m.dl + m.dr) / (absorb.us * 1e6);
      const double naive_tflops = 2.0 * rows * o.shared * (m.dqk() + m.dv) / (naive.us * 1e6);
      const double speedup = absorb.us / hybrid.us;
      const double typhoon = batch >= b_theta ? speedup : 1.0;
      const double diff = RelativeRms(hybrid.out, absorb.out);
      if (o.json) {
        out << nlohmann::json{{"device", gpu::DescribeGpu(props)},
                              {"sq", sq},
                              {"shared", o.shared},
                              {"suffix", o.suffix},
                              {"batch", batch},
                              {"b_theta", b_theta},
                              {"absorb_us", absorb.us},
                              {"hybrid_us", hybrid.us},
                              {"speedup", speedup},
                              {"typhoon_speedup", typhoon},
                              {"rel_rms_diff", diff},
                              {"naive_us", naive.us},
                              {"absorb_tflops", absorb_tflops},
                              {"naive_tflops", naive_tflops}}
                   .dump()
            << "\n";
      } else {
        out << absl::StrFormat(
            "%3d %5d %7.1f %7s %11.1f %11.1f %7.2f %8.2f %9.2e %10.1f %9.0f %9.0f\n", sq, batch,
            b_theta, batch >= b_theta ? "hybrid" : "absorb", absorb.us, hybrid.us, speedup, typhoon,
            diff, naive.us, absorb_tflops, naive_tflops);
      }
      out.flush();
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
