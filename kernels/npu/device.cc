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

absl::StatusOr<std::unique_ptr<Program>> Device::Record(const DeviceKernel& kernel, bool execute,
                                                        ProgramBuffers& buffers,
                                                        double& record_ms) {
  const auto start = std::chrono::steady_clock::now();
  auto program =
      std::make_unique<Program>(profile_, kernel.BlockDim(), execute ? &local_ : nullptr, &buffers);
  RETURN_IF_ERROR(kernel.Record(*program));
  RETURN_IF_ERROR(program->Finalize());
  RETURN_IF_ERROR(CheckGmAccesses(*program, gm_));
  record_ms = MillisecondsSince(start);
  return program;
}

absl::StatusOr<LaunchReport> Device::Launch(const DeviceKernel& kernel, ExecutionMode mode) {
  const DeviceKernel* const one[] = {&kernel};
  ASSIGN_OR_RETURN(std::vector<LaunchReport> reports, LaunchSequence(one, mode));
  return std::move(reports.front());
}

absl::StatusOr<std::vector<LaunchReport>> Device::LaunchSequence(
    std::span<const DeviceKernel* const> kernels, ExecutionMode mode) {
  std::lock_guard<std::mutex> lock(launch_mu_);
  const bool execute = mode == ExecutionMode::kExecute;
  std::vector<LaunchReport> reports;
  if (kernels.empty()) return reports;
  double record_ms = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<Program> program,
                   Record(*kernels[0], execute, program_buffers_[0], record_ms));
  for (size_t i = 0; i < kernels.size(); ++i) {
    const DeviceKernel& kernel = *kernels[i];
    LaunchReport report;
    report.host_record_ms = record_ms;
    // The payloads run on the executor's threads while this one, idle otherwise, records the
    // next launch and models this one's timing: all only read the program (Finalize refused
    // any cycle, on which the executor would wait forever), and the model never reads memory.
    // A program the model refuses (a flag set twice before its wait, say) has then run all
    // the same; its launch still fails.
    const auto run_start = std::chrono::steady_clock::now();
    if (execute) executor_.Start(*program, gm_);
    absl::StatusOr<std::unique_ptr<Program>> next = std::unique_ptr<Program>();
    if (i + 1 < kernels.size()) {
      next = Record(*kernels[i + 1], execute, program_buffers_[(i + 1) % 2], record_ms);
    }
    const auto model_start = std::chrono::steady_clock::now();
    absl::StatusOr<LaunchTiming> modeled = SimulateLaunch(*program, profile_, timing_scratch_);
    report.host_model_ms = MillisecondsSince(model_start);
    if (execute) {
      executor_.Wait();
      report.host_ms = MillisecondsSince(run_start);
    }
    if (!modeled.ok()) return modeled.status();
    if (!next.ok()) return next.status();
    FillReport(kernel, *program, *modeled, report);
    reports.push_back(std::move(report));
    program = *std::move(next);
  }
  return reports;
}

void Device::FillReport(const DeviceKernel& kernel, const Program& program,
                        const LaunchTiming& timing, LaunchReport& report) const {
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
}

}  // namespace mlaserve::npu
