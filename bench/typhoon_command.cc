#include "bench/typhoon_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "absl/strings/str_format.h"
#include "kernels/core/random_fill.h"
#include "common/status_macros.h"
#include "kernels/npu/device.h"
#include "nlohmann/json.hpp"
#include "server/engine/kv/expanded_kv.h"
#include "server/engine/model/model_config.h"
#include "server/engine/model/model_weights.h"
#include "server/engine/devices/npu_batch_launch.h"
#include "server/engine/plan/planner.h"

namespace mlaserve::bench {
namespace {

using engine::ModelConfig;
using engine::NpuBatchLaunch;
using engine::NpuGroup;

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
    for (int i = 0; i < own_pages; ++i) pages[shared_pages + i] = shared_pages + member * own_pages + i;
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

absl::StatusOr<HostData> MakeHostData(const ModelConfig& m, const PageLayout& layout, int shared, int sq) {
  HostData d;
  Rng rng(2026);
  const int dk = m.dk_latent();
  d.pool.resize(static_cast<size_t>(layout.pages()) * layout.page_size * dk);
  FillNormal(d.pool, 1.0, rng);
  const int tail = shared % layout.page_size;  // prefix rows every query copies
  const int64_t page_elems = int64_t{layout.page_size} * dk;
  for (int member = 1; member < layout.members; ++member) {
    std::copy_n(d.pool.begin() + layout.PagesOf(0)[layout.shared_pages] * page_elems, int64_t{tail} * dk,
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

// The batch's inputs in device memory: mapped host data, or unbacked addresses to model.
struct DeviceData {
  npu::GmBuffer pool, kv_b, keys, values;
};

absl::StatusOr<DeviceData> PlaceOnDevice(npu::GlobalMemory& gm, const ModelConfig& m, const PageLayout& layout,
                                         int shared, const HostData* host) {
  DeviceData d;
  const int64_t pool_bytes = layout.pages() * layout.page_size * m.dk_latent() * 2;
  const int64_t kv_b_bytes = int64_t{m.heads} * (m.dn + m.dv) * m.dl * 2;
  const int64_t key_bytes = int64_t{m.heads} * shared * m.dqk() * 2;
  const int64_t value_bytes = int64_t{m.heads} * shared * m.dv * 2;
  if (host == nullptr) {
    ASSIGN_OR_RETURN(d.pool, gm.Allocate(pool_bytes, false, "KV pool"));
    ASSIGN_OR_RETURN(d.kv_b, gm.Allocate(kv_b_bytes, false, "kv_b_proj"));
    ASSIGN_OR_RETURN(d.keys, gm.Allocate(key_bytes, false, "expanded K"));
    ASSIGN_OR_RETURN(d.values, gm.Allocate(value_bytes, false, "expanded V"));
  } else {
    auto map = [&gm](std::span<const Bf16> s, const char* what) {
      return gm.Map(const_cast<Bf16*>(s.data()), static_cast<int64_t>(s.size_bytes()), what);
    };
    ASSIGN_OR_RETURN(d.pool, map(host->pool, "KV pool"));
    ASSIGN_OR_RETURN(d.kv_b, map(host->weights->KvBProj(0), "kv_b_proj"));
    ASSIGN_OR_RETURN(d.keys, map(host->level->keys(), "expanded K"));
    ASSIGN_OR_RETURN(d.values, map(host->level->values(), "expanded V"));
  }
  return d;
}

NpuGroup MakeGroup(const TyphoonCommandOptions& o, int sq, int batch, bool hybrid, const PageLayout& layout,
                   const DeviceData& device, const HostData* host) {
  NpuGroup g;
  g.space = engine::QuerySpace::kHead;
  g.members = batch;
  g.sq = sq;
  g.kv_b = device.kv_b;
  g.pool = device.pool;
  g.page_size = layout.page_size;
  const int32_t length = o.shared + o.suffix;
  for (int member = 0; member < batch; ++member) {
    g.pages.push_back(layout.PagesOf(member));
    g.lengths.push_back(length);
    for (int s = 0; s < sq; ++s) g.visible.push_back(length - sq + 1 + s);
  }
  if (hybrid) {
    g.absorb_from = o.shared;
    g.levels.push_back({0, o.shared, device.keys, device.values});
  }
  if (host != nullptr) {
    g.q_nope = host->q_nope.data();
    g.q_pe = host->q_pe.data();
  }
  return g;
}

struct Timed {
  engine::NpuBatchReport report;
  std::optional<double> host_ms;
  std::vector<float> out;
};

absl::StatusOr<Timed> RunOnce(npu::Device& device, const ModelConfig& m, NpuGroup group,
                              const npu::AttentionDeviceKernelOptions& kernel, bool execute) {
  std::vector<NpuGroup> groups;
  groups.push_back(std::move(group));
  ASSIGN_OR_RETURN(auto launch, NpuBatchLaunch::Create(device, m, std::move(groups), kernel, execute));
  Timed t;
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(t.report, launch->Run(execute ? npu::ExecutionMode::kExecute : npu::ExecutionMode::kModelOnly));
  if (execute) {
    t.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    t.out.assign(launch->out(0).begin(), launch->out(0).end());
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

nlohmann::json LaunchTimes(const engine::NpuBatchReport& report) {
  nlohmann::json launches = nlohmann::json::array();
  for (const npu::LaunchReport& l : report.launches) {
    launches.push_back({{"kernel", l.kernel}, {"modeled_us", l.modeled_us}, {"fu", l.fu}, {"pipe_busy", l.pipe_busy},
                        {"hbm_read_bytes", l.hbm_read_bytes}, {"gm_read_bytes", l.gm_read_bytes}});
  }
  return launches;
}

}  // namespace

absl::Status RunTyphoonCommand(const TyphoonCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(ModelConfig m, engine::PresetModelConfig(o.model, {.layers = 1}));
  if (o.shared < 1 || o.suffix < 1 || o.page_size < 1 || o.batch.empty() || o.sq.empty()) {
    return absl::InvalidArgumentError("--shared, --suffix and --page-size must be >= 1, --batch and --sq non-empty");
  }
  ASSIGN_OR_RETURN(npu::DeviceProfile profile, npu::LoadDeviceProfile(o.profile));
  ASSIGN_OR_RETURN(auto device, npu::Device::Create(profile, {.host_threads = o.host_threads}));
  const engine::DeviceRates rates{
      (o.matrix_tflops > 0 ? o.matrix_tflops * 1e12 : profile.PeakFlops()),
      (o.hbm_tbps > 0 ? o.hbm_tbps * 1e12 : profile.HbmBytesPerSecond())};
  const npu::AttentionDeviceKernelOptions kernel{.algorithm = RescaleAlgorithm::kAmla, .preload = o.preload, .amla = {}};
  const bool execute = !o.model_only;
  const int max_batch = *std::max_element(o.batch.begin(), o.batch.end());
  const int max_sq = *std::max_element(o.sq.begin(), o.sq.end());
  const PageLayout layout(o.page_size, o.shared, o.suffix, max_batch);

  std::optional<HostData> host;
  if (execute) {
    ASSIGN_OR_RETURN(HostData data, MakeHostData(m, layout, o.shared, max_sq));
    host.emplace(std::move(data));
  }
  ASSIGN_OR_RETURN(DeviceData placed, PlaceOnDevice(device->gm(), m, layout, o.shared, host ? &*host : nullptr));

  if (!o.json) {
    out << absl::StrFormat(
        "TyphoonMLA on %s: %s (H=%d), shared Ls=%d, suffix Ln=%d; rates for B_theta: %.1f TFLOPS, %.2f TB/s%s\n",
        profile.name, m.name, m.heads, o.shared, o.suffix, rates.matrix_flops / 1e12,
        rates.memory_bytes_per_second / 1e12, execute ? "" : " (model only)");
    out << absl::StrFormat("%3s %5s %7s %7s %11s %11s %7s %8s %11s %11s %7s %9s\n", "sq", "B", "B_theta", "choice",
                           "absorb_us", "hybrid_us", "speedup", "typhoon", "host_abs_ms", "host_hyb_ms", "host_x",
                           "rel_diff");
  }
  for (int sq : o.sq) {
    const double b_theta = engine::TyphoonBatchThreshold(m, sq, rates);
    for (int batch : o.batch) {
      const char* choice = batch >= b_theta ? "hybrid" : "absorb";
      const HostData* h = host ? &*host : nullptr;
      ASSIGN_OR_RETURN(Timed absorb, RunOnce(*device, m, MakeGroup(o, sq, batch, false, layout, placed, h),
                                             kernel, execute));
      ASSIGN_OR_RETURN(Timed hybrid, RunOnce(*device, m, MakeGroup(o, sq, batch, true, layout, placed, h),
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
        out << absl::StrFormat("%3d %5d %7.1f %7s %11.1f %11.1f %7.2f %8.2f ", sq, batch, b_theta, choice,
                               absorb.report.modeled_us, hybrid.report.modeled_us, speedup, typhoon);
        if (execute) {
          out << absl::StrFormat("%11.1f %11.1f %7.2f %9.2e\n", *absorb.host_ms, *hybrid.host_ms,
                                 *absorb.host_ms / *hybrid.host_ms, RelativeRmsDifference(hybrid.out, absorb.out));
        } else {
          out << absl::StrFormat("%11s %11s %7s %9s\n", "-", "-", "-", "-");
        }
      }
      out.flush();
    }
  }
  for (const npu::GmBuffer& b : {placed.pool, placed.kv_b, placed.keys, placed.values}) device->gm().Release(b);
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
