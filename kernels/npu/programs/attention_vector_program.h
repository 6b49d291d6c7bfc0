#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_VECTOR_PROGRAM_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_VECTOR_PROGRAM_H_

// The AIV side of AttentionDeviceKernel. Each of a block's two AIVs owns half of every row group's
// rows and runs, per task: [V1] online softmax (S -> P), then the rescale of the output
// accumulator (AMLA: an int32 atomic add on O's bits; Base: [V2], O = O * alpha + P V through
// UB), and, when a group's last block is done, the final normalisation.
//
// Internal to the AIV program's files: attention_vector_program.cc (the bf16 softmax, the
// rescale, the final stage, and RecordVector, which drives them) and
// attention_vector_program_fp8.cc (FP8 groups: the queries' and keys' preparation and
// SnapMLA's softmax).

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/mla/amla.h"
#include "kernels/mla/flash_base.h"
#include "kernels/mla/snap_amla.h"
#include "kernels/npu/global_memory.h"
#include "kernels/npu/program.h"
#include "kernels/npu/programs/attention_device_kernel.h"
#include "kernels/npu/programs/attention_schedule.h"
#include "kernels/npu/programs/attention_workload.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {

inline constexpr int kChunkRows = 16;  // rows per UB pass of [V1], rescale and final
inline constexpr int kRowsPerCore = kMaxGroupRows / 2;

struct VectorBuffers {
  SlotRing in;   // GM -> UB: MTE2 -> V, events 0..1
  SlotRing out;  // UB -> GM: V -> MTE3, events 0..1
  // Per-row state that lives in UB across a group's tasks, double-buffered by group so a
  // group's final stage can run after the next group's first softmax.
  AmlaRowState* amla_state;       // [2][kRowsPerCore]
  FlashBaseRowState* base_state;  // [2][kRowsPerCore]
  int32_t* delta;                 // [2][kRowsPerCore]: AMLA rescale, by group slot
  float* alpha;                   // [2][kRowsPerCore]: Base rescale, by task parity
  // FP8 launches: SnapMLA's row state (by group slot), and two side buffers (by task
  // parity, so the next task's scales load while this one's softmax runs): a task's keys'
  // scales, the softmax's weight scratch, this AIV's rows' query factors.
  SnapAmlaRowState* snap_state = nullptr;  // [2][kRowsPerCore]
  struct Fp8Side {
    float* key_scales = nullptr;       // [kKvBlockTokens]
    float* inverse_scales = nullptr;   // [kKvBlockTokens]
    float* weights = nullptr;          // [kKvBlockTokens]
    float* row_factors = nullptr;      // [kRowsPerCore]
    Fp8KeyBlock* key_block = nullptr;  // the task's, from the scales
  };
  Fp8Side side[2];
};

class VectorProgram {
 public:
  VectorProgram(CoreRecorder& aiv, const AttentionWorkload& workload, const AttentionWorkspace& ws,
                const AttentionDeviceKernelOptions& options, VectorBuffers& buffers)
      : aiv_(aiv), w_(workload), ws_(ws), options_(options), b_(buffers) {}

  // [V1]: softmax of this AIV's rows of task t; P goes to the task's probs slot.
  void Softmax(const AttentionTask& t, int slot, int index);

  // [prep] of an FP8 group's task, ahead of its [C1]: on the group's first task this AIV's
  // rows of the queries in [C1]'s form (kernels/mla/snap_amla.h, PrepareQueryRows) and their
  // factors; without an FP8 cube, this AIV's half of the task's keys widened to bf16 into
  // the task's key slot. Then kFlagKeysReady. Nothing for a bf16 group's task.
  void Prepare(const AttentionTask& t, int index);

  // Balances the side buffer's last release (every FP8 softmax sets it once).
  void DrainSide();

  // AMLA: O *= 2^(n_t - n_{t-1}) * c_{t-1}/c_t as one int32 atomic add per element, in GM.
  void AmlaRescale(const AttentionTask& t);

  // Base [V2]: O = O * alpha + P V, through UB.
  void BaseUpdate(const AttentionTask& t, int slot, int index);

  // Final stage: out = O / (l * S16) (AMLA) or O / l (Base), and the LSE.
  void Finalize(const AttentionTask& t);

 private:
  Payload Maybe(Payload p) const { return aiv_.executes() ? std::move(p) : nullptr; }

  // Rows [r0, r0 + rc) of a task's scores (n each) into an in-slot of UB, published and
  // consumed; returns the slot, for the caller to release.
  int ReadScores(const GmBuffer& s_slot, int r0, int rc, int n);

  // Rows [r0, r0 + rc) of P (n elements of `elem` bytes each, rows a bf16 row's bytes apart
  // in UB and in the slot) to the task's probs slot.
  void WriteProbs(const GmBuffer& p_slot, int r0, int rc, int n, int64_t elem,
                  const std::byte* probs);

  void PrepareQueries(const AttentionTask& t, const Fp8Keys& fp8);

  // This AIV's half of the task's keys, widened into the task's key slot ([512][dk] bf16).
  void WidenKeys(const AttentionTask& t, const Fp8Keys& fp8, int index);

  // [V1] of an FP8 group (SnapAmlaSoftmaxStep): the task's key scales and this AIV's query
  // factors come in through the side buffer; P leaves as e4m3 bytes on an FP8 cube, as its
  // (exact) bf16 values otherwise.
  void Fp8Softmax(const AttentionTask& t, const Fp8Keys& fp8, const GmBuffer& s_slot,
                  const GmBuffer& p_slot, int lo, int hi);

  int fp8_softmaxes_ = 0;  // FP8 softmaxes recorded so far on this AIV

  // This AIV's half of a group's rows.
  std::pair<int, int> Rows(const RowGroup& g) const {
    const int half = (g.rows + 1) / 2;
    return aiv_.sub_block() == 0 ? std::pair{0, half} : std::pair{half, g.rows};
  }

  CoreRecorder& aiv_;
  const AttentionWorkload& w_;
  const AttentionWorkspace& ws_;
  const AttentionDeviceKernelOptions& options_;
  VectorBuffers& b_;
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_ATTENTION_VECTOR_PROGRAM_H_
