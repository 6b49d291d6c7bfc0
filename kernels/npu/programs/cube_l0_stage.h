#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_CUBE_L0_STAGE_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_CUBE_L0_STAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/npu/program.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {

// The inner stage of every cube program: MTE1 stages operand tiles from L1 into L0A/L0B
// ping-pong halves (32 KiB each), the M pipe multiplies them into one of two 128 x 128 fp32
// L0C tiles, and FIX writes a finished tile to GM, with the flags between MTE1, M and FIX.
//
// On the host the L1 buffers hold operands widened to fp32 and the MMAD reads them there
// (the staging copy would change no bit); callers must therefore release an L1 buffer from
// the M pipe, after the last Multiply that reads it. Every MMAD is one MatmulTile call,
// C += A . B with B laid out [k][n]; an A . B^T product is formed transposed as
// kernels/core/matmul.h defines it, with A stored transposed in L1 (MTE2's ND -> fractal
// conversion on the device) and the tile transposed back when FIX writes it.
class CubeL0Stage {
 public:
  static constexpr int kTile = 128;  // baseM = baseN

  static absl::StatusOr<std::unique_ptr<CubeL0Stage>> Create(CoreRecorder& aic);

  // A [rows][cols] window of an L1 buffer (row stride ld): one MMAD operand.
  struct Operand {
    const float* src = nullptr;
    int64_t ld = 0;
    int rows = 0;
    int cols = 0;
  };

  // Takes the next L0C tile for writing (the M pipe waits until FIX has drained it).
  int AcquireTile();
  float* tile(int t) const { return l0c_->slot(t).as<float>(); }

  // C(tile) (+)= A . B, A given [m][k] and B [k][n].
  void Multiply(int m, int n, int k, const Operand& a, const char* a_label, const Operand& b,
                const char* b_label, int tile, bool accumulate, const char* label);

  // Hands a finished tile to FIX, which writes it with `write` into `dst`, then frees it.
  void Flush(int tile, const GmRegion& dst, AtomicMode atomic, Payload write, const char* label);

  void Drain();

 private:
  explicit CubeL0Stage(CoreRecorder& aic) : aic_(aic) {}

  CoreRecorder& aic_;
  std::unique_ptr<SlotRing> l0_;   // L0A + L0B halves: MTE1 -> M, events 0..1
  std::unique_ptr<SlotRing> l0c_;  // L0C tiles: M -> FIX, events 0..1
};

// Copies `rows` bf16 rows of `width` (source row stride `stride`) into an L1 buffer's fp32
// shadow [rows][width].
void WidenRowsToL1(const Bf16* src, int64_t stride, int rows, int width, float* dst);

// The same rows stored transposed, as the shadow [width][rows].
void WidenTransposedToL1(const Bf16* src, int64_t stride, int rows, int width, float* dst);

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_CUBE_L0_STAGE_H_
