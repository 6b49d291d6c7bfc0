#ifndef MLASERVE_KERNELS_NPU_INSTRUCTION_H_
#define MLASERVE_KERNELS_NPU_INSTRUCTION_H_

#include <cstdint>

#include "kernels/npu/pipe.h"

namespace mlaserve::npu {

enum class OpKind : uint8_t {
  kSetFlag,        // intra-core: fires when all earlier work of its pipe is done
  kWaitFlag,       // intra-core: blocks its pipe until the matching set fired
  kCrossCoreSet,   // AIC <-> AIV counter increment, issued on a pipe
  kCrossCoreWait,  // blocks the core's instruction issue until the counter is positive
  kGmRead,         // MTE2: GM -> L1 / UB
  kGmWrite,        // FIX (L0C -> GM) or MTE3 (UB -> GM), plain or atomic
  kLoadL0,         // MTE1: L1 -> L0A / L0B
  kMmad,           // M: one fractal-tiled multiply-accumulate into L0C
  kVector,         // V: one or more vector API calls
};

// How a GM write combines with what is there (Ascend C's SetAtomicAdd<T>).
enum class AtomicMode : uint8_t {
  kNone,
  kAddF32,
  // AMLA's rescale: an int32 add on fp32 words with zero/underflow handling (see
  // kernels/core/fp32_exponent_add.h). The hardware's int32 atomic add is the raw add;
  // this variant is a documented modelling choice, costed like any int32 atomic add.
  kAddExponentI32,
  kAddRawI32,
};

// Cross-core waits are not on a pipe: they stall the core's scalar issue.
inline constexpr int8_t kIssueBarrier = -1;

// One recorded instruction: where it runs, what it costs, and (when the launch executes)
// the host work that gives it its effect.
struct Instruction {
  int32_t core = 0;
  int8_t pipe = 0;  // a Pipe, or kIssueBarrier
  OpKind kind = OpKind::kVector;
  AtomicMode atomic = AtomicMode::kNone;
  bool vector_core = false;
  // Occupancy: cycles the pipe is busy (before shared-bandwidth queueing). The next
  // instruction of the same pipe may start when it ends.
  int64_t cycles = 0;
  // Completion latency on top of the occupancy: when the result is visible to flags
  // (DMA latency, MMAD pipeline head; for sets, the flag's propagation time).
  int64_t latency = 0;
  int64_t gm_bytes = 0;  // bytes through the L2 / HBM path
  uint64_t gm_addr = 0;  // footprint: gm_rows runs of gm_row_bytes, gm_stride apart
  int64_t gm_rows = 0;
  int64_t gm_row_bytes = 0;
  int64_t gm_stride = 0;
  int32_t payload = -1;  // index of the host work, -1 for none
  const char* label = "";
};

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_INSTRUCTION_H_
