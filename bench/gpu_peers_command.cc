#include "bench/gpu_peers_command.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu_resident_inputs.h"
#include "bench/host_description.h"
#include "bench/latent_decode_batch.h"
#include "bench/peer_process.h"
#include "bench/typhoon_batch.h"
#include "bench/typhoon_command.h"
#include "common/status_macros.h"
#include "kernels/core/random_fill.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/gpu/open_gpu.h"
#include "nlohmann/json.hpp"
#include "server/engine/model/model_config.h"

#ifndef MLASERVE_SOURCE_DIR
#define MLASERVE_SOURCE_DIR "."
#endif

namespace mlaserve::bench {
namespace {

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

// The file of one shape's inputs that both sides read, in a temporary directory of its own
// (removed with this object), with the peer's answers beside it.
class InputsFile {
 public:
  static absl::StatusOr<std::unique_ptr<InputsFile>> Create() {
    const char* tmp = getenv("TMPDIR");
    std::string dir =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/mlaserve-gpu-peers-XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp ", dir, ": ", strerror(errno)));
    }
    return std::unique_ptr<InputsFile>(new InputsFile(dir));
  }
  ~InputsFile() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  InputsFile(const InputsFile&) = delete;
  InputsFile& operator=(const InputsFile&) = delete;

  // Starts the file afresh.
  void Clear() {
    std::ofstream(path(), std::ios::binary | std::ios::trunc);
    tensors_ = nlohmann::json::object();
    bytes_ = 0;
  }
  // Appends `values` as tensor `name` of `shape` (bf16).
  absl::Status Write(const std::string& name, std::span<const Bf16> values,
                     std::vector<int64_t> shape) {
    std::ofstream file(path(), std::ios::binary | std::ios::app);
    file.write(reinterpret_cast<const char*>(values.data()),
               static_cast<std::streamsize>(values.size_bytes()));
    if (!file) return absl::InternalError(absl::StrCat("writing ", path()));
    tensors_[name] = {{"offset", bytes_}, {"shape", shape}};
    bytes_ += static_cast<int64_t>(values.size_bytes());
    return absl::OkStatus();
  }
  std::string path() const { return dir_ + "/inputs.bin"; }
  std::string answer_path() const { return dir_ + "/answer.bin"; }
  const nlohmann::json& tensors() const { return tensors_; }

 private:
  explicit InputsFile(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  nlohmann::json tensors_ = nlohmann::json::object();
  int64_t bytes_ = 0;
};

// The peer worker and the names of the peers it could load.
struct Peer {
  std::unique_ptr<PeerProcess> process;
  bool has_flashmla = false;

  absl::StatusOr<std::vector<double>> Time(const std::string& peer, int repeats) {
    ASSIGN_OR_RETURN(
        nlohmann::json reply,
        process->Call({{"op", "time"}, {"peer", peer}, {"repeats", repeats}, {"warmup", 2}}));
    return reply["us"].get<std::vector<double>>();
  }

  struct Answer {
    std::vector<float> out, lse;
  };
  absl::StatusOr<Answer> AnswerOf(const std::string& peer, const std::string& path) {
    ASSIGN_OR_RETURN(nlohmann::json reply,
                     process->Call({{"op", "answer"}, {"peer", peer}, {"out_file", path}}));
    Answer a;
    a.out.resize(reply["elements"].get<size_t>());
    a.lse.resize(reply["lse_elements"].get<size_t>());
    std::ifstream file(path, std::ios::binary);
    file.read(reinterpret_cast<char*>(a.out.data()),
              static_cast<std::streamsize>(a.out.size() * sizeof(float)));
    file.read(reinterpret_cast<char*>(a.lse.data()),
              static_cast<std::streamsize>(a.lse.size() * sizeof(float)));
    if (!file) return absl::InternalError(absl::StrCat("reading the peer's answer ", path));
    return a;
  }
};

absl::StatusOr<Peer> StartPeer(const GpuPeersCommandOptions& o, std::ostream& out) {
  Peer peer;
  const std::string worker = MLASERVE_SOURCE_DIR "/bench/peers/flashmla_worker.py";
  ASSIGN_OR_RETURN(peer.process, PeerProcess::Start({o.python, worker}, {}));
  ASSIGN_OR_RETURN(nlohmann::json info, peer.process->Call({{"op", "info"}}));
  peer.has_flashmla = !info["flash_mla"].is_null();
  if (!o.json) {
    out << absl::StrFormat("peers: torch %s (CUDA %s) on %s; FlashMLA %s\n",
                           info["torch"].get<std::string>(), info["cuda"].get<std::string>(),
                           info["gpu"].get<std::string>(),
                           peer.has_flashmla ? info["flash_mla"].get<std::string>()
                                             : "not found (flash_mla on the peer's PYTHONPATH)");
  }
  return peer;
}

// The peers' medians over every round, alternating with mlaserve's runs.
struct PeerTimes {
  std::vector<double> flashmla, torch;
};
absl::Status TimePeers(Peer& peer, int repeats, PeerTimes& times) {
  if (peer.has_flashmla) {
    ASSIGN_OR_RETURN(std::vector<double> us, peer.Time("flashmla", repeats));
    times.flashmla.insert(times.flashmla.end(), us.begin(), us.end());
  }
  ASSIGN_OR_RETURN(std::vector<double> us, peer.Time("torch", repeats));
  times.torch.insert(times.torch.end(), us.begin(), us.end());
  return absl::OkStatus();
}

// The largest |a - b|; NaN where the two differ in length or are empty (as RelativeRms).
double MaxAbsDiff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size() || a.empty()) return kMissing;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double{a[i]} - b[i]));
  return worst;
}

// One shape of the absorb form.
struct AbsorbShape {
  int batch, heads, sq, sk;
};

// Times one shape on both sides, alternating, and prints its row.
absl::Status RunAbsorbShape(const GpuPeersCommandOptions& o, AbsorbShape shape,
                            gpu::GpuRuntime& runtime, gpu::GpuBatchExecutor& executor, Peer& peer,
                            InputsFile& file, Rng& rng, std::ostream& out) {
  const gpu::DeviceProperties& props = runtime.properties();
  const auto [batch, heads, sq, sk] = shape;
  const int pages_per_seq = (sk + o.page_size - 1) / o.page_size;
  const int64_t pool_pages = int64_t{batch} * pages_per_seq;
  const int distinct_pages = static_cast<int>(std::min<int64_t>(kDistinctPoolPages, pool_pages));
  std::vector<Bf16> distinct(static_cast<size_t>(distinct_pages) * o.page_size * kKeyWidth);
  FillNormal(distinct, 0.1, rng);  // the public tests' scale (randn / 10)
  std::vector<Bf16> q(static_cast<size_t>(batch) * sq * heads * kKeyWidth);
  FillNormal(q, 1.0, rng);
  file.Clear();
  RETURN_IF_ERROR(file.Write("distinct", distinct, {distinct_pages, o.page_size, kKeyWidth}));
  RETURN_IF_ERROR(file.Write("q", q, {batch, sq, heads, kKeyWidth}));
  RETURN_IF_ERROR(peer.process
                      ->Call({{"op", "load"},
                              {"file", file.path()},
                              {"tensors", file.tensors()},
                              {"form", "absorb"},
                              {"batch", batch},
                              {"heads", heads},
                              {"sq", sq},
                              {"page_size", o.page_size},
                              {"pages_per_seq", pages_per_seq},
                              {"pool_pages", pool_pages},
                              {"seqlen", sk},
                              {"scale", kDeepSeekScale}})
                      .status());
  static const Bf16 kNamesThePool{};
  ResidentInputs inputs(runtime);
  RETURN_IF_ERROR(inputs.AddRepeated(&kNamesThePool, pool_pages * o.page_size * kKeyWidth * 2,
                                     std::as_bytes(std::span<const Bf16>(distinct))));
  std::vector<int32_t> table(static_cast<size_t>(pool_pages));
  std::iota(table.begin(), table.end(), 0);
  const NamedPool pool{&kNamesThePool, pool_pages, o.page_size, false, {}};
  const DecodeBatch decode =
      MakeLatentBatch(batch, heads, sq, sk, table, pages_per_seq, q.data(), pool, props.sm_count);
  std::vector<double> ours_us;
  PeerTimes peers;
  GpuTimed ours;
  for (int r = 0; r < o.rounds; ++r) {
    ASSIGN_OR_RETURN(ours, TimeOnGpu(executor, props, decode, inputs, o.repeats));
    ours_us.insert(ours_us.end(), ours.us.begin(), ours.us.end());
    RETURN_IF_ERROR(TimePeers(peer, o.repeats, peers));
  }
  Peer::Answer fmla, torch;
  if (peer.has_flashmla) {
    ASSIGN_OR_RETURN(fmla, peer.AnswerOf("flashmla", file.answer_path()));
  }
  ASSIGN_OR_RETURN(torch, peer.AnswerOf("torch", file.answer_path()));
  const double flops =
      2.0 * batch * sq * heads * static_cast<double>(sk) * (kKeyWidth + kLatentWidth);
  const double bytes = 2.0 * batch * static_cast<double>(sk) * kKeyWidth;  // the cache, read once
  const double t_ours = Median(ours_us), t_fmla = Median(peers.flashmla),
               t_torch = Median(peers.torch);
  // mlaserve's answers against FlashMLA's (PyTorch's where FlashMLA is missing).
  const Peer::Answer& reference = peer.has_flashmla ? fmla : torch;
  const double rel = RelativeRms(ours.out, reference.out);
  const double dlse = MaxAbsDiff(ours.lse, reference.lse);
  const double rel_torch = peer.has_flashmla ? RelativeRms(torch.out, fmla.out) : kMissing;
  if (o.json) {
    out << nlohmann::json{{"form", "absorb"},
                          {"gpu", gpu::DescribeGpu(props)},
                          {"batch", batch},
                          {"heads", heads},
                          {"sq", sq},
                          {"sk", sk},
                          {"ours_us", t_ours},
                          {"flashmla_us", t_fmla},
                          {"torch_us", t_torch},
                          {"ours_tflops", flops / t_ours / 1e6},
                          {"flashmla_tflops", flops / t_fmla / 1e6},
                          {"torch_tflops", flops / t_torch / 1e6},
                          {"ours_gbps", bytes / t_ours / 1e3},
                          {"flashmla_gbps", bytes / t_fmla / 1e3},
                          {"rel_rms", rel},
                          {"reference", peer.has_flashmla ? "flashmla" : "torch"},
                          {"lse_max_diff", dlse},
                          {"launches", ours.launches}}
               .dump()
        << "\n";
  } else {
    out << absl::StrFormat(
        "%4d %4d %3d %6d %9.1f %9.1f %9.1f %6.0f %6.0f %6.0f %6.0f %6.0f %6.2f %6.2f "
        "%8.1e %8.1e %8.1e\n",
        batch, heads, sq, sk, t_ours, t_fmla, t_torch, flops / t_ours / 1e6, flops / t_fmla / 1e6,
        flops / t_torch / 1e6, bytes / t_ours / 1e3, bytes / t_fmla / 1e3, t_fmla / t_ours,
        t_torch / t_ours, rel, dlse, rel_torch);
  }
  out.flush();
  return absl::OkStatus();
}

absl::Status RunAbsorbForm(const GpuPeersCommandOptions& o, gpu::GpuRuntime& runtime, Peer& peer,
                           std::ostream& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<InputsFile> file, InputsFile::Create());
  if (!o.json) {
    out << absl::StrFormat(
        "absorb decode (FlashMLA's dense problem), bf16 cache in %d-token pages, causal over a "
        "request's sq tokens; median of %d rounds x %d calls a side, alternating; x: the "
        "peer's time over mlaserve's; rel: RMS of mlaserve's answer minus FlashMLA's (PyTorch's "
        "without FlashMLA), over FlashMLA's; dlse: the largest LSE difference; rel_trch: "
        "PyTorch's answer against FlashMLA's\n",
        o.page_size, o.rounds, o.repeats);
    out << absl::StrFormat("%4s %4s %3s %6s %9s %9s %9s %6s %6s %6s %6s %6s %6s %6s %8s %8s %8s\n",
                           "B", "H", "sq", "sk", "ours_us", "fmla_us", "torch_us", "ours_TF",
                           "fmla_TF", "torch_TF", "ours_GB", "fmla_GB", "x_fmla", "x_torch", "rel",
                           "dlse", "rel_trch");
  }
  Rng rng(2026);
  gpu::GpuBatchExecutor executor(runtime);
  for (int batch : o.batch) {
    for (int heads : o.heads) {
      for (int sq : o.sq) {
        for (int sk : o.sk) {
          RETURN_IF_ERROR(
              RunAbsorbShape(o, {batch, heads, sq, sk}, runtime, executor, peer, *file, rng, out));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RunTyphoonForm(const GpuPeersCommandOptions& o, gpu::GpuRuntime& runtime, Peer& peer,
                            std::ostream& out) {
  const gpu::DeviceProperties& props = runtime.properties();
  ASSIGN_OR_RETURN(engine::ModelConfig m, engine::PresetModelConfig(o.model, {.layers = 1}));
  TyphoonCommandOptions t;
  t.model = o.model;
  t.shared = o.shared;
  t.suffix = o.suffix;
  t.page_size = o.page_size;
  const engine::DeviceRates rates = GpuTyphoonRates(props, t);
  const int max_batch = *std::max_element(o.typhoon_batch.begin(), o.typhoon_batch.end());
  ASSIGN_OR_RETURN(std::unique_ptr<InputsFile> file, InputsFile::Create());
  if (!o.json) {
    out << absl::StrFormat(
        "TyphoonMLA's shapes: %s (H=%d), a shared prefix of %d tokens and %d of each query's "
        "own, %d-token pages; mlaserve's hybrid and absorb-only beside the peers' absorb-only "
        "on the absorbed queries; median of %d rounds x %d calls a side, alternating; served: "
        "the planner's choice (hybrid from B_theta); x: the peer's time over ours; rel: RMS of "
        "the hybrid's answer minus FlashMLA's (PyTorch's without FlashMLA) projected by W_UV, "
        "over it\n",
        m.name, m.heads, o.shared, o.suffix, o.page_size, o.rounds, o.repeats);
    out << absl::StrFormat("%4s %4s %7s %7s %9s %9s %9s %9s %8s %8s %8s %8s %8s\n", "sq", "B",
                           "B_theta", "served", "hybrid_us", "absorb_us", "fmla_us", "torch_us",
                           "x_fmla", "hyb_fmla", "abs_fmla", "x_torch", "rel");
  }
  gpu::GpuBatchExecutor executor(runtime);
  for (int sq : o.sq) {
    const PageLayout layout(o.page_size, o.shared, o.suffix, max_batch);
    ASSIGN_OR_RETURN(HostData host, MakeHostData(m, layout, o.shared, sq));
    const std::span<const Bf16> kv_b = host.weights->KvBProj(0);
    file->Clear();
    RETURN_IF_ERROR(file->Write("pool", host.pool, {layout.pages(), o.page_size, m.dk_latent()}));
    RETURN_IF_ERROR(file->Write("q_nope", host.q_nope, {max_batch, sq, m.heads, m.dn}));
    RETURN_IF_ERROR(file->Write("q_pe", host.q_pe, {max_batch, sq, m.heads, m.dr}));
    RETURN_IF_ERROR(file->Write("kv_b", kv_b, {m.heads, m.dn + m.dv, m.dl}));
    ResidentInputs inputs(runtime);
    RETURN_IF_ERROR(AddTyphoonInputs(inputs, host));
    std::vector<std::vector<int32_t>> pages;
    for (int member = 0; member < max_batch; ++member) pages.push_back(layout.PagesOf(member));
    const double b_theta = engine::TyphoonBatchThreshold(m, sq, rates);
    for (int batch : o.typhoon_batch) {
      RETURN_IF_ERROR(peer.process
                          ->Call({{"op", "load"},
                                  {"file", file->path()},
                                  {"tensors", file->tensors()},
                                  {"form", "typhoon"},
                                  {"batch", batch},
                                  {"heads", m.heads},
                                  {"sq", sq},
                                  {"page_size", o.page_size},
                                  {"seqlen", o.shared + o.suffix},
                                  {"scale", m.dims().softmax_scale},
                                  {"table", std::vector<std::vector<int32_t>>(
                                                pages.begin(), pages.begin() + batch)}})
                          .status());
      const DecodeBatch hybrid_batch =
          MakeBatch(t, m, sq, batch, true, layout, pages, &host, props.sm_count);
      const DecodeBatch absorb_batch =
          MakeBatch(t, m, sq, batch, false, layout, pages, &host, props.sm_count);
      std::vector<double> hybrid_us, absorb_us;
      PeerTimes peers;
      GpuTimed hybrid;
      for (int r = 0; r < o.rounds; ++r) {
        ASSIGN_OR_RETURN(GpuTimed absorb,
                         TimeOnGpu(executor, props, absorb_batch, inputs, o.repeats));
        absorb_us.insert(absorb_us.end(), absorb.us.begin(), absorb.us.end());
        ASSIGN_OR_RETURN(hybrid, TimeOnGpu(executor, props, hybrid_batch, inputs, o.repeats));
        hybrid_us.insert(hybrid_us.end(), hybrid.us.begin(), hybrid.us.end());
        RETURN_IF_ERROR(TimePeers(peer, o.repeats, peers));
      }
      // The hybrid's answers against FlashMLA's (PyTorch's where FlashMLA is missing).
      ASSIGN_OR_RETURN(
          Peer::Answer reference,
          peer.AnswerOf(peer.has_flashmla ? "flashmla" : "torch", file->answer_path()));
      const double rel = RelativeRms(hybrid.out, reference.out);
      const double t_hybrid = Median(hybrid_us), t_absorb = Median(absorb_us);
      const double t_served = batch >= b_theta ? t_hybrid : t_absorb;
      const double t_fmla = Median(peers.flashmla), t_torch = Median(peers.torch);
      if (o.json) {
        out << nlohmann::json{{"form", "typhoon"},
                              {"gpu", gpu::DescribeGpu(props)},
                              {"model", m.name},
                              {"heads", m.heads},
                              {"shared", o.shared},
                              {"suffix", o.suffix},
                              {"sq", sq},
                              {"batch", batch},
                              {"b_theta", b_theta},
                              {"hybrid_us", t_hybrid},
                              {"absorb_us", t_absorb},
                              {"served_us", t_served},
                              {"flashmla_us", t_fmla},
                              {"torch_us", t_torch},
                              {"rel_rms", rel},
                              {"reference", peer.has_flashmla ? "flashmla" : "torch"}}
                   .dump()
            << "\n";
      } else {
        out << absl::StrFormat(
            "%4d %4d %7.1f %7s %9.1f %9.1f %9.1f %9.1f %8.2f %8.2f %8.2f %8.2f "
            "%8.1e\n",
            sq, batch, b_theta, batch >= b_theta ? "hybrid" : "absorb", t_hybrid, t_absorb, t_fmla,
            t_torch, t_fmla / t_served, t_fmla / t_hybrid, t_fmla / t_absorb, t_torch / t_served,
            rel);
      }
      out.flush();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGpuPeersCommand(const GpuPeersCommandOptions& o, std::ostream& out) {
  if (o.form != "absorb" && o.form != "typhoon") {
    return absl::InvalidArgumentError(
        absl::StrCat("--forms: gpu-peers runs absorb or typhoon, not '", o.form, "'"));
  }
  if (o.repeats < 1 || o.rounds < 1 || o.page_size < 1) {
    return absl::InvalidArgumentError("--repeats, --rounds and --page-size must be >= 1");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::GpuRuntime> runtime, gpu::OpenGpu(o.device));
  if (!o.json) {
    out << absl::StrFormat("mlaserve-bench gpu-peers on %s\n%s\n",
                           gpu::DescribeGpu(runtime->properties()), HostDescription());
  }
  ASSIGN_OR_RETURN(Peer peer, StartPeer(o, out));
  return o.form == "absorb" ? RunAbsorbForm(o, *runtime, peer, out)
                            : RunTyphoonForm(o, *runtime, peer, out);
}

}  // namespace mlaserve::bench
