#ifndef MLASERVE_KERNELS_NPU_DEVICE_PROFILE_H_
#define MLASERVE_KERNELS_NPU_DEVICE_PROFILE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlaserve::npu {

// Everything the emulator knows about a part: core counts, memory sizes and alignments,
// pipe rates and latencies. Profiles are data (kernels/npu/profiles/*.json, each number
// with its origin), so a user can model another part without touching code.
struct DeviceProfile {
  std::string name;
  std::string description;

  double clock_ghz = 0;
  int dies = 0;
  int cube_cores = 0;
  int vector_cores_per_cube = 0;
  int64_t cube_macs_per_cycle = 0;
  // The cube's rate on e4m3 operands, 0 when it has none (the Ascend 910: FP8 data must then
  // be widened to bf16 by the vector cores first).
  int64_t cube_fp8_macs_per_cycle = 0;
  int64_t mmad_head_cycles = 0;

  int64_t hbm_bytes = 0;
  double hbm_bytes_per_cycle = 0;
  int64_t l2_bytes = 0;
  double l2_bytes_per_cycle = 0;
  int64_t l2_line_bytes = 0;

  int64_t l1_bytes = 0;
  int64_t l0a_bytes = 0;
  int64_t l0b_bytes = 0;
  int64_t l0c_bytes = 0;
  int64_t ub_bytes = 0;
  int64_t l1_alignment = 0;
  int64_t l0ab_alignment = 0;
  int64_t l0c_alignment = 0;
  int64_t ub_alignment = 0;
  int64_t gm_alignment = 0;

  double cube_mte2_bytes_per_cycle = 0;
  double vector_mte2_bytes_per_cycle = 0;
  double mte1_l0a_bytes_per_cycle = 0;
  double mte1_l0b_bytes_per_cycle = 0;
  double fix_bytes_per_cycle = 0;
  double mte3_bytes_per_cycle = 0;

  int64_t gm_read_head_cycles = 0;
  int64_t hbm_miss_extra_cycles = 0;
  int64_t gm_write_head_cycles = 0;
  int64_t mte1_head_cycles = 0;
  int64_t fix_head_cycles = 0;
  int64_t vector_head_cycles = 0;
  int64_t vector_unary_cycles_per_repeat = 0;
  int64_t vector_binary_cycles_per_repeat = 0;
  int64_t vector_exp_cycles_per_repeat = 0;
  int64_t vector_reduce_cycles_per_repeat = 0;
  int64_t vector_div_cycles_per_repeat = 0;

  int64_t flag_latency_cycles = 0;
  int64_t cross_core_flag_latency_cycles = 0;
  // The device-side head of a launch: a fixed part, a part per block started (growing with
  // the cores a launch uses, counted per die since each die starts its own), by kernel
  // type, and each core's prologue (tiling data to its stack, scalar set-up).
  int64_t launch_overhead_cycles = 0;         // MIX (AIC + AIVs) and AIC-only launches
  int64_t mix_block_start_cycles = 0;         // per AIC + 2 AIV group of a MIX launch
  int64_t cube_block_start_cycles = 0;        // per AIC of an AIC-only launch
  int64_t vector_launch_overhead_cycles = 0;  // AIV-only launches
  int64_t vector_block_start_cycles = 0;      // per AIV of an AIV-only launch
  int64_t core_prologue_cycles = 0;

  // Parameter name -> where its value comes from, as written in the profile.
  std::map<std::string, std::string> origins;

  int vector_cores() const { return cube_cores * vector_cores_per_cube; }
  bool HasFp8Matrix() const { return cube_fp8_macs_per_cycle > 0; }
  // Peak matrix rate in FLOP/s (a MAC is two FLOPs).
  double PeakFlops() const { return 2.0 * cube_cores * cube_macs_per_cycle * clock_ghz * 1e9; }
  double HbmBytesPerSecond() const { return hbm_bytes_per_cycle * clock_ghz * 1e9; }
  double CyclesToMicroseconds(double cycles) const { return cycles / (clock_ghz * 1e3); }
};

// Parses and validates a profile document. Every parameter must be present, positive (or
// non-negative for latencies) and sane; unknown parameters are errors, not ignored.
absl::StatusOr<DeviceProfile> ParseDeviceProfile(absl::string_view json_text);

// Loads a profile by file path, or by name from the profile search path:
// $MLASERVE_PROFILE_PATH (colon-separated directories), the installed profile directory,
// then the source tree's kernels/npu/profiles.
absl::StatusOr<DeviceProfile> LoadDeviceProfile(absl::string_view name_or_path);

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_DEVICE_PROFILE_H_
