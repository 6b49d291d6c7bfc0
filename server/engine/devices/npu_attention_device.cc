#include "server/engine/devices/npu_attention_device.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/core/row_matmul.h"
#include "kernels/npu/programs/batch_launch.h"
#include "spdlog/spdlog.h"

namespace mlaserve::engine {

absl::StatusOr<std::unique_ptr<NpuAttentionDevice>> NpuAttentionDevice::Create(
    npu::DeviceProfile profile, npu::DeviceOptions device_options,
    npu::AttentionDeviceKernelOptions kernel_options, int lendable_threads) {
  if (kernel_options.algorithm != RescaleAlgorithm::kAmla) {
    // The pool's devices must agree with the host's AMLA arithmetic bit for bit.
    return absl::InvalidArgumentError("npu attention device: only the AMLA kernel serves");
  }
  const int own_threads = device_options.host_threads;
  device_options.host_threads = std::max(own_threads, lendable_threads);
  ASSIGN_OR_RETURN(std::unique_ptr<npu::Device> device,
                   npu::Device::Create(std::move(profile), device_options));
  device->SetHostParallelism(own_threads);
  return std::unique_ptr<NpuAttentionDevice>(
      new NpuAttentionDevice(std::move(device), kernel_options, own_threads));
}

NpuAttentionDevice::NpuAttentionDevice(std::unique_ptr<npu::Device> device,
                                       npu::AttentionDeviceKernelOptions options, int own_threads)
    : device_(std::move(device)), own_threads_(own_threads), options_(options) {
  const npu::DeviceProfile& p = device_->profile();
  info_.profile = p.name;
  info_.host_threads = own_threads;
  info_.parallel_units = p.cube_cores;
  info_.matrix_tflops = p.PeakFlops() / 1e12;
  info_.fp8_matrix_tflops = p.PeakFlops() / 1e12 * static_cast<double>(p.cube_fp8_macs_per_cycle) /
                            static_cast<double>(p.cube_macs_per_cycle);
  info_.hbm_tbps = p.HbmBytesPerSecond() / 1e12;
  // The cube's tile calls run on the host's matrix path, whose row kernel's sums are defined
  // row by row, whatever rows share a call.
  info_.invariant_projection_rows = kRowMatmulRows;
}

absl::StatusOr<DeviceRun> NpuAttentionDevice::Run(const BatchSteps& steps) {
  ASSIGN_OR_RETURN(std::unique_ptr<npu::BatchLaunch> launch,
                   npu::BatchLaunch::Create(*device_, steps, options_, /*backed=*/true));
  ASSIGN_OR_RETURN(npu::BatchLaunchReport report, launch->Run(npu::ExecutionMode::kExecute));
  if (spdlog::should_log(spdlog::level::debug)) {
    // Where the batch's host time went, launch by launch: the emulator's own bookkeeping
    // (recording, the timing model) beside the payloads it executed.
    std::string launches;
    for (const npu::LaunchReport& l : report.launches) {
      absl::StrAppendFormat(&launches, " %s(%d instructions: record %.2f, model %.2f, run %.2f ms)",
                            l.kernel, l.instructions, l.host_record_ms, l.host_model_ms,
                            l.host_ms.value_or(0));
    }
    spdlog::debug("{}: batch modelled {:.1f} us;{}", info_.profile, report.modeled_us, launches);
  }
  DeviceRun run;
  run.modeled_us = report.modeled_us;
  run.buffers = std::move(launch);
  return run;
}

}  // namespace mlaserve::engine
