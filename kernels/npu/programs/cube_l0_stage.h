#ifndef MLASERVE_KERNELS_NPU_PROGRAMS_CUBE_L0_STAGE_H_
#define MLASERVE_KERNELS_NPU_PROGRAMS_CUBE_L0_STAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/float8_e4m3.h"
#include "kernels/npu/program.h"
#include "kernels/npu/programs/slot_ring.h"

namespace mlaserve::npu {

// The inner stage of every cube program: MTE1 stages operand tiles from L1 into L0A/L0B
// ping-pong halves (32 KiB each), the M pipe multiplies them into one of two 128 x 128 fp32
// L0C tiles, and FIX writes a finished tile to GM, with the flags between MTE1, M and FIX.
//
// On the host the MMAD reads its operands straight from L1 (the staging copy into L0A/L0B
// would change no bit); callers must therefore release an L1 buffer from the M pipe, after
// the last Multiply that reads it. Every MMAD is one tile call of kernels/core/matmul.h,
// whose operands are compact: L1 buffers are laid out in depth blocks of the MMAD's depth
// ([block][rows][depth]), as the cube's fractal L1 layout also is, so each MMAD's operand is
// one contiguous block.
class CubeL0Stage {
 public:
  static constexpr int kTile = 128;  // baseM = baseN

  static absl::StatusOr<std::unique_ptr<CubeL0Stage>> Create(CoreRecorder& aic);

  // A compact [rows][cols] block of an L1 buffer: one MMAD operand.
  struct Operand {
    const Bf16* src = nullptr;
    int rows = 0;
    int cols = 0;
  };

  // Takes the next L0C tile for writing (the M pipe waits until FIX has drained it).
  int AcquireTile();
  float* tile(int t) const { return l0c_->slot(t).as<float>(); }

  // C(tile) (+)= A . B, A given [m][k] and B [k][n], or A . B^T with B given [n][k]. The
  // first `fp8_k` of the depth are e4m3 on the device (1-byte L0 operands, the FP8 rate); the
  // host holds them widened to bf16, which multiplies to the same bits.
  void Multiply(int m, int n, int k, const Operand& a, const char* a_label, const Operand& b,
                const char* b_label, bool b_transposed, int tile, bool accumulate,
                const char* label, int fp8_k = 0);

  // Hands a finished tile to FIX, which writes it with `write` into `dst`, then frees it.
  void Flush(int tile, const GmRegion& dst, AtomicMode atomic, Payload write, const char* label);

  void Drain();

 private:
  explicit CubeL0Stage(CoreRecorder& aic) : aic_(aic) {}

  CoreRecorder& aic_;
  std::unique_ptr<SlotRing> l0_;   // L0A + L0B halves: MTE1 -> M, events 0..1
  std::unique_ptr<SlotRing> l0c_;  // L0C tiles: M -> FIX, events 0..1
};

// Copies `rows` bf16 rows of `width` (source row stride `stride`) into an L1 buffer laid out
// in depth blocks of `block` columns: block b holds columns [b * block, ...) of all
// `buffer_rows` rows as a compact [buffer_rows][width of block b] matrix, starting at
// b * buffer_rows * block. The rows land at rows [row0, row0 + rows) of the buffer.
void CopyRowsToL1(const Bf16* src, int64_t stride, int rows, int width, int block, Bf16* dst,
                  int buffer_rows, int row0);

// The same for rows in the FP8 form (kernels/core/fp8_latent_row.h): columns
// [col0, col0 + width) of `rows` rows whose first `dl` columns are e4m3 bytes (row r's at
// content + r * content_stride) and the rest bf16 (row r's at rope + r * rope_stride bytes),
// widened to bf16 (exact) as they land. The host's L1 holds operands widened; the device's
// would hold the bytes, which multiply to the same values.
void WidenFp8RowsToL1(const std::byte* content, int64_t content_stride, const std::byte* rope,
                      int64_t rope_stride, int dl, int rows, int col0, int width, int block,
                      Bf16* dst, int buffer_rows, int row0);

// Block b of such a buffer. A launch that only models its time has no memory (null): no
// block of it exists, and offsetting a null pointer would be undefined.
inline const Bf16* L1Block(const Bf16* buffer, int buffer_rows, int block, int b) {
  if (buffer == nullptr) return nullptr;
  return buffer + static_cast<int64_t>(b) * buffer_rows * block;
}

}  // namespace mlaserve::npu

#endif  // MLASERVE_KERNELS_NPU_PROGRAMS_CUBE_L0_STAGE_H_
