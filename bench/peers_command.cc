#include "bench/peers_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/host_description.h"
#include "bench/peer_process.h"
#include "common/status_macros.h"
#include "kernels/core/random_fill.h"
#include "kernels/mla/batch_step_builder.h"
#include "kernels/mla/host_batch_runner.h"
#include "kernels/npu/device.h"
#include "kernels/npu/device_profile.h"
#include "kernels/npu/programs/batch_launch.h"

#ifndef MLASERVE_SOURCE_DIR
#define MLASERVE_SOURCE_DIR "."
#endif

namespace mlaserve::bench {
namespace {

constexpr int kPeerPageSize = 128;
constexpr int kPeerDn = 128, kPeerDr = 64, kPeerDl = 512, kPeerDv = 128;

struct Shape {
  std::string form;
  int batch, heads, sq, sk;

  double Flops() const {
    const double rows = double{1} * batch * heads * sq;
    return form == "absorb" ? 2 * rows * sk * (kPeerDl + kPeerDr + kPeerDl)
                            : 2 * rows * sk * (kPeerDn + kPeerDr + kPeerDv);
  }
};

// One shape's inputs and steps on mlaserve's side. Absorb: a latent-space group of `batch`
// sequences of sk tokens. Naive: a head-space group on an sk-token prefix, only its naive
// step kept.
struct OurBatch {
  std::vector<Bf16> pool, q, q_pe, kv_b, keys, values;
  std::vector<std::vector<int32_t>> pages;
  BuiltBatch built;
};

// How a device splits a batch's keys (the engine's DeviceInfo for it): the host device over
// its threads, the emulated device over its cube cores with the default knobs.
struct SplitKnobs {
  int parallel_units = 1;
  int split_block_tokens = DecodeBatch{}.split_block_tokens;
  int split_part_overhead_blocks = DecodeBatch{}.split_part_overhead_blocks;
};

absl::StatusOr<std::unique_ptr<OurBatch>> MakeOurs(const Shape& s, const SplitKnobs& split,
                                                   Rng& rng) {
  auto ours = std::make_unique<OurBatch>();
  const int H = s.heads;
  const int pages_per_sequence = (s.sk + kPeerPageSize - 1) / kPeerPageSize;
  const bool absorb = s.form == "absorb";
  const int sequences = absorb ? s.batch : 1;  // the naive form reads one shared prefix
  ours->pool.resize(static_cast<size_t>(sequences) * pages_per_sequence * kPeerPageSize *
                    (kPeerDl + kPeerDr));
  if (absorb) FillNormal(ours->pool, 1.0, rng);
  for (int m = 0; m < s.batch; ++m) {
    std::vector<int32_t> table(pages_per_sequence);
    for (int p = 0; p < pages_per_sequence; ++p)
      table[p] = (absorb ? m : 0) * pages_per_sequence + p;
    ours->pages.push_back(std::move(table));
  }
  DecodeBatch b;
  b.dims =
      MlaDims{H, kPeerDn, kPeerDr, kPeerDl, kPeerDv, static_cast<float>(1.0 / std::sqrt(192.0))};
  b.pool = ours->pool.data();
  b.pool_pages = int64_t{sequences} * pages_per_sequence;
  b.page_size = kPeerPageSize;
  b.parallel_units = split.parallel_units;
  b.split_block_tokens = split.split_block_tokens;
  b.split_part_overhead_blocks = split.split_part_overhead_blocks;
  DecodeBatch::Group g;
  g.head_space = !absorb;
  g.sq = s.sq;
  g.out_bf16 = true;
  const int64_t rows = int64_t{s.sq} * H;
  ours->q.resize(static_cast<size_t>(s.batch * rows * (absorb ? kPeerDl + kPeerDr : kPeerDn)));
  FillNormal(ours->q, 1.0, rng);
  if (!absorb) {
    ours->q_pe.resize(static_cast<size_t>(s.batch * rows * kPeerDr));
    FillNormal(ours->q_pe, 1.0, rng);
    ours->kv_b.resize(static_cast<size_t>(H) * (kPeerDn + kPeerDv) * kPeerDl);
    FillNormal(ours->kv_b, 0.04, rng);
    ours->keys.resize(static_cast<size_t>(H) * s.sk * (kPeerDn + kPeerDr));
    ours->values.resize(static_cast<size_t>(H) * s.sk * kPeerDv);
    FillNormal(ours->keys, 1.0, rng);
    FillNormal(ours->values, 1.0, rng);
    g.kv_b = ours->kv_b.data();
    g.absorb_from = s.sk;
    g.naive_passes = {0};
    b.passes.push_back({ours->keys.data(), ours->values.data(), 0, s.sk, {0}});
  }
  for (int m = 0; m < s.batch; ++m) {
    DecodeBatch::Member member;
    member.pages = ours->pages[m];
    member.length = s.sk;
    if (absorb) {
      member.q_latent = ours->q.data() + m * rows * (kPeerDl + kPeerDr);
    } else {
      member.q_nope = ours->q.data() + m * rows * kPeerDn;
      member.q_pe = ours->q_pe.data() + m * rows * kPeerDr;
    }
    g.members.push_back(member);
  }
  b.groups.push_back(std::move(g));
  ASSIGN_OR_RETURN(ours->built, BuildBatchSteps(b));
  if (!absorb) {  // time the shared-prefix pass alone, as the peer's naive form is
    std::vector<BatchStep> kept;
    for (BatchStep& step : ours->built.steps.steps) {
      if (const auto* a = std::get_if<AttentionStep>(&step); a != nullptr && a->name == "naive")
        kept.push_back(step);
    }
    ours->built.steps.steps = std::move(kept);
  }
  return ours;
}

// Runs our side's steps once on the chosen device.
class OurDevice {
 public:
  static absl::StatusOr<std::unique_ptr<OurDevice>> Create(const PeersCommandOptions& o) {
    auto ours = std::unique_ptr<OurDevice>(new OurDevice());
    if (o.device == "npu") {
      ASSIGN_OR_RETURN(npu::DeviceProfile profile, npu::LoadDeviceProfile(o.profile));
      ASSIGN_OR_RETURN(ours->npu_, npu::Device::Create(profile, {.host_threads = o.threads}));
      ours->split_.parallel_units = profile.cube_cores;
    } else if (o.device == "host") {
      ours->runner_.emplace(o.threads);
      ours->split_ = {o.threads, HostBatchRunner::kSplitBlockTokens,
                      HostBatchRunner::kSplitPartOverheadBlocks};
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: peers runs on host or npu, not '", o.device, "'"));
    }
    return ours;
  }

  const SplitKnobs& split() const { return split_; }
  std::string Describe() const {
    return npu_ == nullptr
               ? "the host device"
               : absl::StrCat("the emulated device ", npu_->profile().name, " (split-KV over ",
                              split_.parallel_units, " cube cores)");
  }

  // What the server's device does with a batch: the host runner's steps, or the emulated
  // device's launches built and executed.
  absl::Status Run(const BatchSteps& steps) {
    if (npu_ == nullptr) return runner_->Run(steps).status();
    ASSIGN_OR_RETURN(std::unique_ptr<npu::BatchLaunch> launch,
                     npu::BatchLaunch::Create(*npu_, steps, {}, /*backed=*/true));
    return launch->Run(npu::ExecutionMode::kExecute).status();
  }

 private:
  OurDevice() = default;

  std::optional<HostBatchRunner> runner_;  // the host device's (its threads only there)
  std::unique_ptr<npu::Device> npu_;
  SplitKnobs split_;
};

struct Result {
  Shape shape;
  double ours_s = std::numeric_limits<double>::infinity();
  double fp32_s = std::numeric_limits<double>::infinity();
  double bf16_s = std::numeric_limits<double>::infinity();
};

}  // namespace

absl::Status RunPeersCommand(const PeersCommandOptions& o, std::ostream& out) {
  std::map<std::string, std::string> env;
  if (o.peer_env == "tuned") {
    // What the peer needs to be at its best here (docs/performance.md has the ablation):
    // torch's own kernels on AVX-512, OpenBLAS's own kernel choice (this VM's environment
    // forces its AVX2 ones), huge pages for the scores' fresh allocations.
    env = {{"ATEN_CPU_CAPABILITY", "avx512"},
           {"OPENBLAS_CORETYPE", ""},
           {"GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"}};
  } else if (o.peer_env != "as-is") {
    return absl::InvalidArgumentError("--peer-env: 'tuned' or 'as-is'");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<OurDevice> ours_device, OurDevice::Create(o));
  const std::string worker = std::string(MLASERVE_SOURCE_DIR) + "/bench/peers/torch_mla_worker.py";
  ASSIGN_OR_RETURN(auto peer, PeerProcess::Start({o.python, worker}, env));
  ASSIGN_OR_RETURN(nlohmann::json info, peer->Call({{"op", "info"}}));
  if (!o.json) {
    out << HostDescription() << "\n";
    out << absl::StrFormat(
        "peer: torch %s, cpu capability %s, %d threads each side, env %s; best of %d x %d, "
        "alternating; mlaserve on %s\n",
        info["torch"].get<std::string>(), info["cpu_capability"].get<std::string>(), o.threads,
        o.peer_env, o.rounds, o.repeats, ours_device->Describe());
    out << absl::StrFormat("%-6s %4s %4s %3s %6s %12s %12s %12s %8s\n", "form", "B", "H", "sq",
                           "sk", "mlaserve_GF/s", "torch_fp32", "torch_bf16", "x_best");
  }
  Rng rng(2026);
  for (const std::string& form : o.forms) {
    if (form != "absorb" && form != "naive")
      return absl::InvalidArgumentError("--forms: absorb and/or naive");
    for (int heads : o.heads) {
      for (int batch : o.batch) {
        for (int sq : o.sq) {
          for (int sk : o.sk) {
            Result r{Shape{form, batch, heads, sq, sk}};
            ASSIGN_OR_RETURN(auto ours, MakeOurs(r.shape, ours_device->split(), rng));
            // First touch and JIT outside the timing.
            RETURN_IF_ERROR(ours_device->Run(ours->built.steps));
            for (int round = 0; round < o.rounds; ++round) {
              for (int i = 0; i < o.repeats; ++i) {
                const auto start = std::chrono::steady_clock::now();
                RETURN_IF_ERROR(ours_device->Run(ours->built.steps));
                r.ours_s =
                    std::min(r.ours_s,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                                 .count());
              }
              for (const char* dtype : {"fp32", "bf16"}) {
                ASSIGN_OR_RETURN(nlohmann::json reply, peer->Call({{"op", "time"},
                                                                   {"form", form},
                                                                   {"dtype", dtype},
                                                                   {"batch", batch},
                                                                   {"heads", heads},
                                                                   {"sq", sq},
                                                                   {"sk", sk},
                                                                   {"repeats", o.repeats},
                                                                   {"warmup", 1},
                                                                   {"threads", o.threads},
                                                                   {"seed", round}}));
                double& best = std::string(dtype) == "fp32" ? r.fp32_s : r.bf16_s;
                best = std::min(best, reply["best_s"].get<double>());
              }
            }
            const double flops = r.shape.Flops();
            const double ratio = std::min(r.fp32_s, r.bf16_s) / r.ours_s;
            if (o.json) {
              out << nlohmann::json{{"form", form},
                                    {"batch", batch},
                                    {"heads", heads},
                                    {"sq", sq},
                                    {"sk", sk},
                                    {"mlaserve_gflops", flops / r.ours_s / 1e9},
                                    {"torch_fp32_gflops", flops / r.fp32_s / 1e9},
                                    {"torch_bf16_gflops", flops / r.bf16_s / 1e9},
                                    {"over_best_peer", ratio},
                                    {"cpu", info["cpu_capability"]},
                                    {"device", o.device},
                                    {"profile", o.device == "npu" ? o.profile : ""},
                                    {"host", HostDescription()},
                                    {"peer_env", o.peer_env}}
                         .dump()
                  << "\n";
            } else {
              out << absl::StrFormat("%-6s %4d %4d %3d %6d %12.1f %12.1f %12.1f %8.2f\n", form,
                                     batch, heads, sq, sk, flops / r.ours_s / 1e9,
                                     flops / r.fp32_s / 1e9, flops / r.bf16_s / 1e9, ratio);
            }
            out.flush();
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
