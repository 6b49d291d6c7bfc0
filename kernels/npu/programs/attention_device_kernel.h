#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_DEVICE_KERNEL_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_DEVICE_KERNEL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/tiling.h"
#include "kernels/mla/amla.h"
#include "kernels/mla/rescale_algorithm.h"
#include "kernels/npu/device_kernel.h"
#include "kernels/npu/global_memory.h"
#include "kernels/npu/programs/attention_schedule.h"
#include "kernels/npu/programs/attention_workload.h"

namespace mlaserve::npu {

struct AttentionDeviceKernelOptions {
  // kAmla: the AIVs rescale O in place with an int32 atomic add on its bits, then the AIC
  // atomically adds P V into it (fp32): O never leaves global memory. kBase: the AIC writes
  // P V to a workspace and the AIVs read O and P V into UB, compute O * alpha + P V, and
  // write O back (the GM -> UB -> GM [V2] stage).
  RescaleAlgorithm algorithm = RescaleAlgorithm::kAmla;
  // Preload count: how many tasks the AIC's Q K^T ([C1]) runs ahead of its P V ([C2]).
  // 2 is the paper's pipeline; 0 serialises cube and vector stages.
  int preload = 2;
  AmlaOptions amla{};
  // The device's cube multiplies e4m3 operands (DeviceProfile::HasFp8Matrix). FP8 groups then
  // feed it the cache's bytes, P in e4m3 and the queries' fp8 content; without it the AIVs
  // widen each block of keys to bf16 in a workspace the cube reads, and P stays bf16.
  bool fp8_matrix = false;
};

// Global-memory scratch of one launch, beside its inputs and outputs.
struct AttentionWorkspace {
  int slots = 0;              // in-flight tasks per block: preload + 1
  GmBuffer scores;            // [blocks][slots][256][512] fp32: [C1] -> [V1]
  GmBuffer probs;             // [blocks][slots][256][512] bf16: [V1] -> [C2]
  GmBuffer partial;           // Base only: [blocks][slots][256][dv] fp32, [C2] -> [V2]
  std::vector<GmBuffer> acc;  // per row group: [rows][dv] fp32 output accumulator
  // FP8 launches only. Per row group: its queries as [C1] multiplies them (q_prep: [rows][dk]
  // bf16, or [rows] x (dl e4m3 bytes + dr bf16) on an FP8 cube) and their factors f_i
  // (q_factor: [rows] fp32); written by the AIVs before the group's first [C1].
  std::vector<GmBuffer> q_prep;
  std::vector<GmBuffer> q_factor;
  // Without an FP8 cube: [blocks][key_slots][512][dk] bf16, each task's keys widened by the
  // AIVs, key_slots = preload + 2 tasks in flight.
  GmBuffer keys;
  int key_slots = 0;

  static constexpr int64_t Fp8QueryRowBytes(int dl, int dr) { return dl + 2 * int64_t{dr}; }
  GmBuffer KeySlot(int block, int slot, int dk) const {
    const int64_t slot_bytes = int64_t{kKvBlockTokens} * dk * 2;
    return keys.Slice((static_cast<int64_t>(block) * key_slots + slot) * slot_bytes, slot_bytes);
  }
  // One block's slot of a [blocks][slots][256][row] workspace (`row_bytes` per row): the
  // layout the AIC and its AIVs must agree on.
  GmBuffer SlotRows(const GmBuffer& workspace, int block, int slot, int64_t row_bytes) const {
    const int64_t slot_bytes = kMaxGroupRows * row_bytes;
    return workspace.Slice((static_cast<int64_t>(block) * slots + slot) * slot_bytes, slot_bytes);
  }
};

// The kernels the launch can run: FP8 groups only under AMLA (SnapMLA over AMLA), and on an
// FP8 cube only with quantised queries; UNIMPLEMENTED saying which otherwise.
absl::Status CheckAttentionSupported(const AttentionWorkload& workload,
                                     const AttentionDeviceKernelOptions& options);

absl::StatusOr<AttentionWorkspace> AllocateAttentionWorkspace(
    GlobalMemory& gm, const AttentionWorkload& workload, int blocks,
    const AttentionDeviceKernelOptions& options, bool backed);
void ReleaseAttentionWorkspace(GlobalMemory& gm, const AttentionWorkspace& workspace);

// Decode attention on the emulated NPU, structured as the AMLA paper runs it: tasks of up to
// 256 query rows x 512 keys; per block one AIC runs Q K^T and P V with hierarchical tiling
// (GM -> L1 in 72 KiB buffers -> L0 tiles of 128 x 128, baseK 96 for Q K^T and 128 for P V,
// results accumulated in L0C before FIX), and two AIVs run the online softmax, the rescale
// and the final normalisation, all overlapped by the preload pipeline.
//
// Cross-core flags (mode 2, AIC <-> its two AIVs), one set and one wait per task each:
//   kFlagScoresReady  AIC -> AIV   S of task t is in GM            ([C1] -> [V1])
//   kFlagProbsReady   AIV -> AIC   P of task t is in GM            ([V1] -> [C2])
//   kFlagPvDone       AIC -> AIV   P V of task t is in GM          ([C2] -> rescale/final)
//   kFlagRescaleDone  AIV -> AIC   AMLA: O rescaled for task t, C2(t) may add into it;
//                                  Base: [V2] of task t done, its P V slot is free
//   kFlagKeysReady    AIV -> AIC   FP8 launches: task t's queries (on its group's first
//                                  task) and, without an FP8 cube, its widened keys are in GM
class AttentionDeviceKernel final : public DeviceKernel {
 public:
  static constexpr int kFlagScoresReady = 1;
  static constexpr int kFlagProbsReady = 2;
  static constexpr int kFlagPvDone = 3;
  static constexpr int kFlagRescaleDone = 4;
  static constexpr int kFlagKeysReady = 5;

  AttentionDeviceKernel(const AttentionWorkload& workload,
                        std::vector<std::vector<AttentionTask>> schedule,
                        const AttentionWorkspace& workspace, AttentionDeviceKernelOptions options);

  std::string Name() const override;
  int BlockDim() const override { return static_cast<int>(schedule_.size()); }
  double Flops() const override;
  absl::Status Record(Program& program) const override;

 private:
  absl::Status RecordCube(CoreRecorder& aic) const;
  absl::Status RecordVector(CoreRecorder& aiv) const;

  const AttentionWorkload& workload_;
  std::vector<std::vector<AttentionTask>> schedule_;
  const AttentionWorkspace& workspace_;
  AttentionDeviceKernelOptions options_;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_DEVICE_KERNEL_H_
