#include "kernels/npu/device.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/npu/timing_model.h"

namespace mlaserve::npu {

absl::StatusOr<std::unique_ptr<Device>> Device::Create(DeviceProfile profile,
                                                       DeviceOptions options) {
  if (options.host_threads < 1 || options.host_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_threads = ", options.host_threads, " must be in 1..256"));
  }
  return std::unique_ptr<Device>(new Device(std::move(profile), options));
}

Device::Device(DeviceProfile profile, DeviceOptions options)
    : profile_(std::move(profile)),
      gm_(profile_.hbm_bytes, profile_.gm_alignment),
      local_(profile_),
      executor_(options.host_threads) {}

namespace {

// Every DMA must stay inside a live GM buffer: on the device an overrun corrupts a neighbour
// silently; here it would corrupt host memory. Checked before anything runs.
absl::Status CheckGmAccesses(const Program& program, const GlobalMemory& gm) {
  const std::vector<Instruction>& instructions = program.instructions();
  GlobalMemory::AccessChecker checker(gm);
  for (uint32_t id = 0; id < instructions.size(); ++id) {
    const Instruction& ins = instructions[id];
    if (ins.gm_rows <= 0 || ins.gm_row_bytes <= 0) continue;
    const int64_t span = (ins.gm_rows - 1) * ins.gm_stride + ins.gm_row_bytes;
    absl::Status status = checker.Check(ins.gm_addr, span);
    if (!status.ok()) {
      return absl::OutOfRangeError(absl::StrCat(program.Describe(id), ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  const auto elapsed = std::chrono::steady_clock::now() - start;
  return std::chrono::duration<double, std::milli>(elapsed).count();
}

}  // namespace

absl::StatusOr<LaunchReport> Device::Launch(const DeviceKernel& kernel, ExecutionMode mode) {
  std::lock_guard<std::mutex> lock(launch_mu_);
  const bool execute = mode == ExecutionMode::kExecute;
  LaunchReport report;
  auto start = std::chrono::steady_clock::now();
  Program program(profile_, kernel.BlockDim(), execute ? &local_ : nullptr, &program_buffers_);
  RETURN_IF_ERROR(kernel.Record(program));
  RETURN_IF_ERROR(program.Finalize());
  RETURN_IF_ERROR(CheckGmAccesses(program, gm_));
  report.host_record_ms = MillisecondsSince(start);
  // The payloads run on the executor's threads while this one, idle otherwise, models the
  // launch's timing: both only read the program (Finalize refused any cycle, on which the
  // executor would wait forever), and the model never reads memory. A program
  // the model refuses (a flag set twice before its wait, say) has then run all the same; its
  // launch still fails.
  const auto run_start = std::chrono::steady_clock::now();
  if (execute) executor_.Start(program, gm_);
  start = std::chrono::steady_clock::now();
  absl::StatusOr<LaunchTiming> modeled = SimulateLaunch(program, profile_, timing_scratch_);
  report.host_model_ms = MillisecondsSince(start);
  if (execute) {
    executor_.Wait();
    report.host_ms = MillisecondsSince(run_start);
  }
  if (!modeled.ok()) return modeled.status();
  const LaunchTiming& timing = *modeled;

  report.kernel = kernel.Name();
  report.block_dim = program.block_dim();
  report.modeled_cycles = timing.total_cycles;
  report.modeled_us = profile_.CyclesToMicroseconds(static_cast<double>(timing.total_cycles));
  report.flops = kernel.Flops();
  report.fu = report.flops / (report.modeled_us * 1e-6 * profile_.PeakFlops());
  report.instructions = timing.instructions;
  report.gm_read_bytes = timing.gm_read_bytes;
  report.hbm_read_bytes = timing.hbm_read_bytes;
  report.gm_write_bytes = timing.gm_write_bytes;
  report.mmad_shapes = program.mmad_shapes();
  const double cube_capacity = static_cast<double>(timing.total_cycles) * profile_.cube_cores;
  const double vector_capacity = static_cast<double>(timing.total_cycles) * profile_.vector_cores();
  for (Pipe pipe : {Pipe::kMte2, Pipe::kMte1, Pipe::kM, Pipe::kFix}) {
    report.pipe_busy[absl::StrCat("AIC.", PipeName(pipe))] =
        static_cast<double>(timing.cube_busy[static_cast<int>(pipe)]) / cube_capacity;
  }
  for (Pipe pipe : {Pipe::kMte2, Pipe::kV, Pipe::kMte3}) {
    report.pipe_busy[absl::StrCat("AIV.", PipeName(pipe))] =
        static_cast<double>(timing.vector_busy[static_cast<int>(pipe)]) / vector_capacity;
  }
  return report;
}

}  // namespace mlaserve::npu
