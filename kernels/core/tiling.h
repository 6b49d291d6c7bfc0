#ifndef MLASERVE_KERNELS_CORE_TILING_H_
#define MLASERVE_KERNELS_CORE_TILING_H_

#include <cstdint>

namespace mlaserve {

// The AMLA paper's tiling (§4.2), shared by the host kernels and the emulated device so that
// both round identically.
inline constexpr int kKvBlockTokens = 512;  // KV tokens per FlashAttention iteration
inline constexpr int kQkDepthChunk = 96;    // baseK of Q·K^T (576 = 6 x 96)
inline constexpr int kPvDepthChunk = 128;   // baseK of P·V (512 tokens = 4 x 128)
// Depth chunk of the up-projection GEMMs (q_nope·W_UK, o_lat·W_UV^T, c_kv·W_UK^T/W_UV^T).
inline constexpr int kProjectionDepthChunk = 128;

// Blocks of b covering a (a >= 0, b > 0).
inline constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_TILING_H_
