#include "bench/typhoon_command.h"

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

// Where the batch's pages are: the prefix's whole pages first (shared by every query), then
// each query's own pages in query order, the first of which starts with its copy of the
// prefix's partial last page. Query m's pages do not depend on the batch size, so one layout
// for the largest batch serves every smaller one.
struct PageLayout {
  int page_size = 0;
  int shared_pages = 0;  // whole pages of the prefix
  int own_pages = 0;     // per query
  int members = 0;

  PageLayout(int page, int shared, int suffix, int queries)
      : page_size(page),
        shared_pages(shared / page),
        own_pages((shared + suffix + page - 1) / page - shared / page),
        members(queries) {}
  int64_t pages() const { return shared_pages + int64_t{own_pages} * members; }
  std::vector<int32_t> PagesOf(int member) const {
    std::vector<int32_t> pages(shared_pages + own_pages);
    for (int i = 0; i < shared_pages; ++i) pages[i] = i;
    for (int i = 0; i < own_pages; ++i)
      pages[shared_pages + i] = shared_pages + member * own_pages + i;
    return pages;
  }
};

// Random inputs of the largest batch, for executed runs.
struct HostData {
  std::vector<Bf16> pool;  // [pages][page_size][dk]
  std::vector<Bf16> q_nope, q_pe;
  std::optional<engine::ModelWeights> weights;
  std::optional<engine::ExpandedKvData> level;  // the prefix's expanded K/V
};

absl::StatusOr<HostData> MakeHostData(const ModelConfig& m, const PageLayout& layout, int shared,
                                      int sq) {
  HostData d;
  Rng rng(2026);
  const int dk = m.dk_latent();
  d.pool.resize(static_cast<size_t>(layout.pages()) * layout.page_size * dk);
  FillNormal(d.pool, 1.0, rng);
  const int tail = shared % layout.page_size;  // prefix rows every query copies
  const int64_t page_elems = int64_t{layout.page_size} * dk;
  for (int member = 1; member < layout.members; ++member) {
    std::copy_n(d.pool.begin() + layout.PagesOf(0)[layout.shared_pages] * page_elems,
                int64_t{tail} * dk,
                d.pool.begin() + layout.PagesOf(member)[layout.shared_pages] * page_elems);
  }
  const int64_t rows = int64_t{layout.members} * sq * m.heads;
  d.q_nope.resize(rows * m.dn);
  d.q_pe.resize(rows * m.dr);
  FillNormal(d.q_nope, 1.0, rng);
  FillNormal(d.q_pe, 1.0, rng);
  ASSIGN_OR_RETURN(engine::ModelWeights weights, engine::ModelWeights::FromSeed(m, 7));
  d.weights.emplace(std::move(weights));
  ASSIGN_OR_RETURN(auto pages, (TensorView<const Bf16, 3>::Create(
                                   d.pool, {layout.pages(), layout.page_size, dk}, "pool")));
  const std::vector<int32_t> member0 = layout.PagesOf(0);
  d.level.emplace(engine::ExpandedKvData::Build(PagedKvCache{pages}, member0, 0, shared, m.dr,
                                                d.weights->Layer(0)));
  return d;
}

// The batch in the kernels' terms: one head-space group of `batch` queries on a prefix of
// o.shared tokens, each with o.suffix of its own; hybrid runs the prefix as one naive pass.
// Without host data every pointer is null (a model-only launch).
DecodeBatch MakeBatch(const TyphoonCommandOptions& o, const ModelConfig& m, int sq, int batch,
                      bool hybrid, const PageLayout& layout,
                      const std::vector<std::vector<int32_t>>& pages, const HostData* host,
                      int parallel_units) {
  DecodeBatch b;
  b.dims = m.dims();
  b.pool = host != nullptr ? host->pool.data() : nullptr;
  b.pool_pages = layout.pages();
  b.page_size = layout.page_size;
  b.parallel_units = parallel_units;
  DecodeBatch::Group g;
  g.head_space = true;
  g.sq = sq;
  g.kv_b = host != nullptr ? host->weights->KvBProj(0).data() : nullptr;
  const int64_t rows = int64_t{sq} * m.heads;
  for (int member = 0; member < batch; ++member) {
    DecodeBatch::Member x;
    x.pages = pages[member];
    x.length = o.shared + o.suffix;
    if (host != nullptr) {
      x.q_nope = host->q_nope.data() + member * rows * m.dn;
      x.q_pe = host->q_pe.data() + member * rows * m.dr;
    }
    g.members.push_back(x);
  }
  if (hybrid) {
    g.absorb_from = o.shared;
    g.naive_passes = {0};
    b.passes.push_back({host != nullptr ? host->level->keys().data() : nullptr,
                        host != nullptr ? host->level->values().data() : nullptr,
                        0,
                        o.shared,
                        {0}});
  }
  b.groups.push_back(std::move(g));
  return b;
}

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
