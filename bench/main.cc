// mlaserve-bench: the project's measurement tool. One binary, one subcommand per study;
// each prints a table (or JSON lines with --json) and is recorded in docs/performance.md.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/accuracy_command.h"
#include "bench/capacity_command.h"
#include "bench/fp8_command.h"
#include "bench/gpu_host_path_command.h"
#include "bench/gpu_kernel_command.h"
#include "bench/gpu_peers_command.h"
#include "bench/kernel_command.h"
#include "bench/peers_command.h"
#include "bench/service_command.h"
#include "bench/tree_command.h"
#include "bench/typhoon_command.h"
#include "bench/wire_command.h"
#include "common/command_line.h"
#include "common/serving_allocator.h"
#include "common/status_macros.h"
#include "kernels/core/matmul.h"

ABSL_FLAG(bool, json, false, "print one JSON object per line instead of a table");
ABSL_FLAG(int, seeds, 5, "accuracy: random draws per distribution");
ABSL_FLAG(std::string, profile, "",
          "device profile name or path (default: ascend910 for kernel and typhoon, the engine's "
          "ascend910-die for service and peers --device=npu)");
ABSL_FLAG(std::vector<std::string>, kernel, {"amla"},
          "kernel: amla, base and/or snap (SnapMLA over AMLA on the FP8 cache), comma-separated");
ABSL_FLAG(
    std::vector<std::string>, batch, {},
    "kernel: requests in the batch (default 4); typhoon: batch sizes (comma-separated, default "
    "16,32,64,128,256,512,1024); gpu-peers --forms=typhoon: batch sizes (default 64,128,512)");
ABSL_FLAG(int, heads, 128, "kernel: query heads");
ABSL_FLAG(
    std::string, device, "",
    "kernel, typhoon, service, gpu-peers: a GPU to run on instead of the emulated NPU (cuda:N, or "
    "fake-gpu); peers: host (default) or npu (the emulated device of --profile); "
    "kernel's batch defaults to 96 and page size to 64 there, repeats to 20 for both");
ABSL_FLAG(std::vector<std::string>, sq, {"1"},
          "kernel: query tokens per request (comma-separated)");
ABSL_FLAG(std::vector<std::string>, sk, {"4096"},
          "kernel: cached tokens per request (comma-separated)");
ABSL_FLAG(int, preload, 2, "kernel: preload count of the pipeline (0, 1, 2)");
ABSL_FLAG(int, page_size, 128, "kernel: KV cache page size");
ABSL_FLAG(int, host_threads, 2, "kernel: host threads of the emulated device");
ABSL_FLAG(int, repeats, 3,
          "kernel: executed runs, best of N (kernel and SGEMM baseline alternate); on a GPU and "
          "for gpu-peers the median of N (default 20 there)");
ABSL_FLAG(bool, model_only, false, "kernel, typhoon: model the time only, no host arithmetic");
ABSL_FLAG(bool, batch_invariant, false,
          "kernel on a GPU: each shape also in the batch-invariant mode, runs alternating with "
          "the default's, and the ratio of their times");
ABSL_FLAG(int, invariant_part_tokens, 0,
          "kernel on a GPU, --batch_invariant: keys in a split part per 128 rows (0: the server's "
          "4096)");
ABSL_FLAG(bool, split_kv, false,
          "kernel: split a sparse batch's keys over the AIC blocks, as the engine does");
ABSL_FLAG(std::string, model, "deepseek-v3",
          "typhoon, gpu-peers: model preset (deepseek-v3, kimi-k2)");
ABSL_FLAG(double, matrix_tflops, 0, "typhoon: matrix rate T for B_theta (0: the profile's peak)");
ABSL_FLAG(double, hbm_tbps, 0, "typhoon: memory bandwidth M for B_theta (0: the profile's)");
ABSL_FLAG(int, shared, 4096, "typhoon, gpu-peers: tokens of the shared prefix (Ls)");
ABSL_FLAG(int, suffix, 512, "typhoon, gpu-peers: tokens of each query's own suffix (Ln)");
ABSL_FLAG(int, layers, 2, "service: model layers served");
ABSL_FLAG(int, devices, 2, "service: emulated devices in the pool");
ABSL_FLAG(int, rounds, 2,
          "service: runs per path, the paths alternating; gpu-peers: alternations of the sides "
          "(default 3 there)");
ABSL_FLAG(std::vector<std::string>, paths, {},
          "service: the paths compared (default direct,grpc,guarded,packed,shm; also ucx, and "
          "invariant: direct in the batch-invariant mode)");
ABSL_FLAG(int, workers, 1, "service: concurrent callers");
ABSL_FLAG(int, sequences, 8, "service: sequences per caller, all in every call");
ABSL_FLAG(int, prefix_tokens, 1024, "service: shared system prompt tokens");
ABSL_FLAG(int, context_tokens, 128, "service: each sequence's own tokens");
ABSL_FLAG(double, duration_s, 10, "service: seconds per run");
ABSL_FLAG(std::vector<std::string>, forms, {"absorb"},
          "peers: absorb and/or naive; gpu-peers: absorb or typhoon");
ABSL_FLAG(std::vector<std::string>, grid_batch, (std::vector<std::string>{"1", "4", "16", "64"}),
          "peers, gpu-peers (absorb): batch sizes B");
ABSL_FLAG(std::vector<std::string>, grid_heads, (std::vector<std::string>{"64", "128"}),
          "peers, gpu-peers (absorb): head counts H");
ABSL_FLAG(std::vector<std::string>, grid_sq, (std::vector<std::string>{"1", "2"}),
          "peers, gpu-peers: query tokens Sq");
ABSL_FLAG(std::vector<std::string>, grid_sk, (std::vector<std::string>{"1024", "4096", "16384"}),
          "peers, gpu-peers (absorb): cached tokens Sk");
ABSL_FLAG(int, threads, 2, "peers: threads on each side");
ABSL_FLAG(int, children, 4, "tree: child prefixes on the root");
ABSL_FLAG(int, child_tokens, 1024, "tree: tokens each child prefix adds");
ABSL_FLAG(double, data_scale, 0.1,
          "fp8: scale of every data set (0.1: the public tests' randn/10; scores grow with its "
          "square)");
ABSL_FLAG(int64_t, kv_budget_mib, 256, "capacity: KV budget, MiB");
ABSL_FLAG(int, context, 4096, "capacity: tokens per sequence");
ABSL_FLAG(std::string, peer_env, "tuned", "peers: tuned (the peer at its best here) or as-is");
ABSL_FLAG(std::string, peer_python, "/usr/bin/python3",
          "peers: the Python with torch that runs the peer (Debian's python3-torch by default); "
          "gpu-peers: one with CUDA torch and flash_mla");

ABSL_FLAG(std::string, target, "",
          "wire: the server's gRPC address (HOST:PORT), its UCX data plane advertised");
ABSL_FLAG(std::string, wire_echo, "", "wire: the raw TCP far end (HOST:PORT, IPv4)");
ABSL_FLAG(std::string, wire_listen, "",
          "wire: be the raw TCP far end on HOST:PORT (IPv4) instead, until killed");

namespace {

constexpr char kUsage[] =
    "mlaserve-bench <command> [flags]   (flags take - or _ between words)\n"
    "commands:\n"
    "  accuracy   AMLA paper accuracy sweep (Base vs AMLA vs fp64 golden)\n"
    "  kernel     decode attention on the emulated NPU: modelled time, FU, host rate; with\n"
    "             --device=cuda:N on a GPU: device time, TFLOP/s, GB/s\n"
    "  typhoon    TyphoonMLA hybrid vs absorb-only on a shared prefix, per batch size\n"
    "  hostpath   a head-space decode step on a CUDA GPU: projections on the tiled GEMM or the\n"
    "             row kernel, launches enqueued or replayed as CUDA graphs, side by side\n"
    "  service    the same load direct on the engine and through gRPC: throughput ratio, overhead\n"
    "  wire       the UCX data plane against a raw TCP socket pair moving the same bytes,\n"
    "             between two hosts (scripts/ucx_wire_bench.sh: two network namespaces)\n"
    "  peers      mlaserve's host kernels beside PyTorch on the CPU (fp32, bf16), alternating;\n"
    "             --device=npu: the emulated device's execution instead\n"
    "  gpu-peers  mlaserve's GPU kernels beside FlashMLA and a PyTorch absorb on one GPU, same\n"
    "             values, alternating (scripts/flashmla_side_by_side.sh builds FlashMLA)\n"
    "  capacity   KV-bound decode at a fixed budget: sequences held and queries/s, FP8 vs bf16\n"
    "  fp8        FP8 latent cache accuracy per data set and KV format (SnapMLA ablations)\n"
    "  tree       tree-aware vs flat TyphoonMLA grouping on a two-level prefix tree, whole "
    "engine\n";

absl::StatusOr<std::vector<int>> ParseInts(const std::vector<std::string>& items,
                                           const char* flag) {
  std::vector<int> values;
  for (const std::string& item : items) {
    int v = 0;
    if (!absl::SimpleAtoi(item, &v) || v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", item, "' is not a positive integer"));
    }
    values.push_back(v);
  }
  return values;
}

std::string ProfileOr(const char* fallback) {
  const std::string profile = absl::GetFlag(FLAGS_profile);
  return profile.empty() ? fallback : profile;
}

absl::Status Run(const std::string& command) {
  if (command == "accuracy") {
    return mlaserve::bench::RunAccuracyCommand(
        {.seeds = absl::GetFlag(FLAGS_seeds), .json = absl::GetFlag(FLAGS_json)}, std::cout);
  }
  if (command == "kernel" && !absl::GetFlag(FLAGS_device).empty()) {
    mlaserve::bench::GpuKernelCommandOptions o;
    o.device = absl::GetFlag(FLAGS_device);
    o.kernel = absl::GetFlag(FLAGS_kernel).front();
    ASSIGN_OR_RETURN(std::vector<int> batch, ParseInts(absl::GetFlag(FLAGS_batch), "batch"));
    if (batch.size() > 1) return absl::InvalidArgumentError("--batch: kernel takes one batch size");
    if (!batch.empty()) o.batch = batch.front();
    o.heads = absl::GetFlag(FLAGS_heads);
    ASSIGN_OR_RETURN(o.sq, ParseInts(absl::GetFlag(FLAGS_sq), "sq"));
    ASSIGN_OR_RETURN(o.sk, ParseInts(absl::GetFlag(FLAGS_sk), "sk"));
    if (absl::GetFlag(FLAGS_page_size) != 128) o.page_size = absl::GetFlag(FLAGS_page_size);
    if (absl::GetFlag(FLAGS_repeats) != 3) o.repeats = absl::GetFlag(FLAGS_repeats);
    o.json = absl::GetFlag(FLAGS_json);
    o.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
    o.invariant_part_tokens = absl::GetFlag(FLAGS_invariant_part_tokens);
    return mlaserve::bench::RunGpuKernelCommand(o, std::cout);
  }
  if (command == "kernel") {
    mlaserve::bench::KernelCommandOptions o;
    o.profile = ProfileOr("ascend910");
    o.kernels = absl::GetFlag(FLAGS_kernel);
    absl::StatusOr<std::vector<int>> batch = ParseInts(absl::GetFlag(FLAGS_batch), "batch");
    if (!batch.ok()) return batch.status();
    if (batch->size() > 1)
      return absl::InvalidArgumentError("--batch: kernel takes one batch size");
    if (!batch->empty()) o.batch = batch->front();
    o.heads = absl::GetFlag(FLAGS_heads);
    absl::StatusOr<std::vector<int>> sq = ParseInts(absl::GetFlag(FLAGS_sq), "sq");
    if (!sq.ok()) return sq.status();
    absl::StatusOr<std::vector<int>> sk = ParseInts(absl::GetFlag(FLAGS_sk), "sk");
    if (!sk.ok()) return sk.status();
    o.sq = *sq;
    o.sk = *sk;
    o.preload = absl::GetFlag(FLAGS_preload);
    o.page_size = absl::GetFlag(FLAGS_page_size);
    o.host_threads = absl::GetFlag(FLAGS_host_threads);
    o.model_only = absl::GetFlag(FLAGS_model_only);
    o.split_kv = absl::GetFlag(FLAGS_split_kv);
    o.repeats = absl::GetFlag(FLAGS_repeats);
    o.json = absl::GetFlag(FLAGS_json);
    return mlaserve::bench::RunKernelCommand(o, std::cout);
  }
  if (command == "hostpath") {
    mlaserve::bench::GpuHostPathCommandOptions o;
    if (!absl::GetFlag(FLAGS_device).empty()) o.device = absl::GetFlag(FLAGS_device);
    ASSIGN_OR_RETURN(std::vector<int> batch, ParseInts(absl::GetFlag(FLAGS_batch), "batch"));
    if (!batch.empty()) o.batch = batch;
    o.heads = absl::GetFlag(FLAGS_heads);
    ASSIGN_OR_RETURN(std::vector<int> sk, ParseInts(absl::GetFlag(FLAGS_sk), "sk"));
    if (sk.size() != 1) return absl::InvalidArgumentError("--sk: hostpath takes one length");
    if (absl::GetFlag(FLAGS_sk) != std::vector<std::string>{"4096"}) o.keys = sk.front();
    if (absl::GetFlag(FLAGS_repeats) != 3) o.repeats = absl::GetFlag(FLAGS_repeats);
    if (absl::GetFlag(FLAGS_rounds) != 2) o.rounds = absl::GetFlag(FLAGS_rounds);
    return mlaserve::bench::RunGpuHostPathCommand(o, std::cout);
  }
  if (command == "typhoon") {
    mlaserve::bench::TyphoonCommandOptions o;
    o.model = absl::GetFlag(FLAGS_model);
    o.profile = ProfileOr("ascend910");
    o.matrix_tflops = absl::GetFlag(FLAGS_matrix_tflops);
    o.hbm_tbps = absl::GetFlag(FLAGS_hbm_tbps);
    absl::StatusOr<std::vector<int>> sq = ParseInts(absl::GetFlag(FLAGS_sq), "sq");
    if (!sq.ok()) return sq.status();
    o.sq = *sq;
    absl::StatusOr<std::vector<int>> batch = ParseInts(absl::GetFlag(FLAGS_batch), "batch");
    if (!batch.ok()) return batch.status();
    if (!batch->empty()) o.batch = *batch;
    o.shared = absl::GetFlag(FLAGS_shared);
    o.suffix = absl::GetFlag(FLAGS_suffix);
    o.page_size = absl::GetFlag(FLAGS_page_size);
    o.preload = absl::GetFlag(FLAGS_preload);
    o.host_threads = absl::GetFlag(FLAGS_host_threads);
    o.model_only = absl::GetFlag(FLAGS_model_only);
    o.json = absl::GetFlag(FLAGS_json);
    o.device = absl::GetFlag(FLAGS_device);
    if (!o.device.empty()) {
      if (absl::GetFlag(FLAGS_repeats) != 3) o.repeats = absl::GetFlag(FLAGS_repeats);
      return mlaserve::bench::RunGpuTyphoonCommand(o, std::cout);
    }
    return mlaserve::bench::RunTyphoonCommand(o, std::cout);
  }
  if (command == "service") {
    mlaserve::bench::ServiceCommandOptions o;
    o.model = absl::GetFlag(FLAGS_model);
    o.layers = absl::GetFlag(FLAGS_layers);
    o.profile = absl::GetFlag(FLAGS_profile);
    o.devices = absl::GetFlag(FLAGS_devices);
    o.gpu = absl::GetFlag(FLAGS_device);
    o.rounds = absl::GetFlag(FLAGS_rounds);
    if (!absl::GetFlag(FLAGS_paths).empty()) o.paths = absl::GetFlag(FLAGS_paths);
    o.workload.workers = absl::GetFlag(FLAGS_workers);
    o.workload.sequences = absl::GetFlag(FLAGS_sequences);
    o.workload.prefix_tokens = absl::GetFlag(FLAGS_prefix_tokens);
    o.workload.context_tokens = absl::GetFlag(FLAGS_context_tokens);
    absl::StatusOr<std::vector<int>> sq = ParseInts(absl::GetFlag(FLAGS_sq), "sq");
    if (!sq.ok()) return sq.status();
    o.workload.sq = sq->front();
    o.workload.duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
    o.json = absl::GetFlag(FLAGS_json);
    return mlaserve::bench::RunServiceCommand(o, std::cout);
  }
  if (command == "wire") {
    mlaserve::bench::WireCommandOptions o;
    o.model = absl::GetFlag(FLAGS_model);
    o.layers = absl::GetFlag(FLAGS_layers);
    o.listen = absl::GetFlag(FLAGS_wire_listen);
    o.target = absl::GetFlag(FLAGS_target);
    o.echo = absl::GetFlag(FLAGS_wire_echo);
    o.rounds = absl::GetFlag(FLAGS_rounds);
    o.workload.workers = absl::GetFlag(FLAGS_workers);
    o.workload.sequences = absl::GetFlag(FLAGS_sequences);
    o.workload.prefix_tokens = absl::GetFlag(FLAGS_prefix_tokens);
    o.workload.context_tokens = absl::GetFlag(FLAGS_context_tokens);
    ASSIGN_OR_RETURN(std::vector<int> sq, ParseInts(absl::GetFlag(FLAGS_sq), "sq"));
    o.workload.sq = sq.front();
    o.workload.duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
    return mlaserve::bench::RunWireCommand(o, std::cout);
  }
  if (command == "peers") {
    mlaserve::bench::PeersCommandOptions o;
    o.forms = absl::GetFlag(FLAGS_forms);
    ASSIGN_OR_RETURN(o.batch, ParseInts(absl::GetFlag(FLAGS_grid_batch), "grid-batch"));
    ASSIGN_OR_RETURN(o.heads, ParseInts(absl::GetFlag(FLAGS_grid_heads), "grid-heads"));
    ASSIGN_OR_RETURN(o.sq, ParseInts(absl::GetFlag(FLAGS_grid_sq), "grid-sq"));
    ASSIGN_OR_RETURN(o.sk, ParseInts(absl::GetFlag(FLAGS_grid_sk), "grid-sk"));
    o.threads = absl::GetFlag(FLAGS_threads);
    o.repeats = absl::GetFlag(FLAGS_repeats);
    o.rounds = absl::GetFlag(FLAGS_rounds);
    o.peer_env = absl::GetFlag(FLAGS_peer_env);
    o.python = absl::GetFlag(FLAGS_peer_python);
    if (const std::string device = absl::GetFlag(FLAGS_device); !device.empty()) o.device = device;
    if (const std::string profile = absl::GetFlag(FLAGS_profile); !profile.empty()) {
      o.profile = profile;
    }
    o.json = absl::GetFlag(FLAGS_json);
    return mlaserve::bench::RunPeersCommand(o, std::cout);
  }
  if (command == "gpu-peers") {
    mlaserve::bench::GpuPeersCommandOptions o;
    if (const std::string device = absl::GetFlag(FLAGS_device); !device.empty()) o.device = device;
    if (absl::GetFlag(FLAGS_forms).size() != 1) {
      return absl::InvalidArgumentError("--forms: gpu-peers runs one form (absorb or typhoon)");
    }
    o.form = absl::GetFlag(FLAGS_forms).front();
    ASSIGN_OR_RETURN(o.batch, ParseInts(absl::GetFlag(FLAGS_grid_batch), "grid-batch"));
    ASSIGN_OR_RETURN(o.heads, ParseInts(absl::GetFlag(FLAGS_grid_heads), "grid-heads"));
    ASSIGN_OR_RETURN(o.sq, ParseInts(absl::GetFlag(FLAGS_grid_sq), "grid-sq"));
    ASSIGN_OR_RETURN(o.sk, ParseInts(absl::GetFlag(FLAGS_grid_sk), "grid-sk"));
    ASSIGN_OR_RETURN(std::vector<int> batch, ParseInts(absl::GetFlag(FLAGS_batch), "batch"));
    if (!batch.empty()) o.typhoon_batch = batch;
    o.model = absl::GetFlag(FLAGS_model);
    o.shared = absl::GetFlag(FLAGS_shared);
    o.suffix = absl::GetFlag(FLAGS_suffix);
    if (absl::GetFlag(FLAGS_repeats) != 3) o.repeats = absl::GetFlag(FLAGS_repeats);
    if (absl::GetFlag(FLAGS_rounds) != 2) o.rounds = absl::GetFlag(FLAGS_rounds);
    o.python = absl::GetFlag(FLAGS_peer_python);
    o.json = absl::GetFlag(FLAGS_json);
    return mlaserve::bench::RunGpuPeersCommand(o, std::cout);
  }
  if (command == "capacity") {
    mlaserve::bench::CapacityCommandOptions o;
    o.model = absl::GetFlag(FLAGS_model);
    const std::string profile = absl::GetFlag(FLAGS_profile);
    if (!profile.empty()) o.profile = profile;
    o.budget_mib = absl::GetFlag(FLAGS_kv_budget_mib);
    o.context = absl::GetFlag(FLAGS_context);
    o.rounds = absl::GetFlag(FLAGS_rounds) + 1;
    o.host_threads = absl::GetFlag(FLAGS_host_threads);
    o.json = absl::GetFlag(FLAGS_json);
    return mlaserve::bench::RunCapacityCommand(o, std::cout);
  }
  if (command == "fp8") {
    mlaserve::bench::Fp8CommandOptions o;
    o.seeds = absl::GetFlag(FLAGS_seeds);
    o.heads = absl::GetFlag(FLAGS_heads);
    ASSIGN_OR_RETURN(std::vector<int> sq, ParseInts(absl::GetFlag(FLAGS_sq), "sq"));
    ASSIGN_OR_RETURN(std::vector<int> sk, ParseInts(absl::GetFlag(FLAGS_sk), "sk"));
    o.sq = sq.front();
    o.context = sk.front();
    o.data_scale = absl::GetFlag(FLAGS_data_scale);
    o.json = absl::GetFlag(FLAGS_json);
    return mlaserve::bench::RunFp8Command(o, std::cout);
  }
  if (command == "tree") {
    mlaserve::bench::TreeCommandOptions o;
    o.model = absl::GetFlag(FLAGS_model);
    o.profile = ProfileOr("ascend910");
    o.shared = absl::GetFlag(FLAGS_shared);
    o.children = absl::GetFlag(FLAGS_children);
    o.child_tokens = absl::GetFlag(FLAGS_child_tokens);
    ASSIGN_OR_RETURN(std::vector<int> batch, ParseInts(absl::GetFlag(FLAGS_batch), "batch"));
    if (!batch.empty()) o.batch = batch;
    o.suffix = absl::GetFlag(FLAGS_suffix);
    o.rounds = absl::GetFlag(FLAGS_rounds);
    o.host_threads = absl::GetFlag(FLAGS_host_threads);
    o.json = absl::GetFlag(FLAGS_json);
    return mlaserve::bench::RunTreeCommand(o, std::cout);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown command '", command, "'"));
}

}  // namespace

int main(int argc, char** argv) {
  // Every command measures mlaserve's code as mlaserve-server runs it, allocator included.
  mlaserve::TuneAllocatorForServing();
  absl::SetProgramUsageMessage(kUsage);
  // Flag names take dashes or underscores (--model-only = --model_only).
  absl::StatusOr<std::vector<std::string>> args =
      mlaserve::ParseFlags(argc, argv, mlaserve::MatrixPathDescription);
  if (!args.ok()) {
    std::cerr << "mlaserve-bench: " << args.status() << "\n";
    return 2;
  }
  if (args->size() != 1) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string& command = args->front();
  const absl::Status status = Run(command);
  if (!status.ok()) {
    std::cerr << "mlaserve-bench " << command << ": " << status << "\n";
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
