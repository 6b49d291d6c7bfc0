#ifndef MLASERVE_KERNELS_CUDA_LATENT_TILES_CUH_
#define MLASERVE_KERNELS_CUDA_LATENT_TILES_CUH_

// The shared-memory layout both Hopper latent-cache kernels give Q and a key block: 576 bf16
// a row as 9 tiles of 64 columns, each tile 64 rows of 128 bytes with the 128-byte swizzle
// the tensor cores (and the bulk tensor copy) use (wgmma.cuh).

#include <cstdint>

#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/gpu/gpu_jobs.h"

namespace mlaserve::cuda::latent {

inline constexpr int kDk = 576;
inline constexpr int kChunks = kDk / 64;  // 64-column tiles across a row
inline constexpr int kTileBytes = 64 * 128;
inline constexpr int kMatrixBytes = kChunks * kTileBytes;

// The byte of element (row, 8-element unit `unit` of the row) in a matrix of kChunks tiles.
__device__ __forceinline__ uint32_t TileUnit(uint32_t base, int row, int unit) {
  const int chunk = unit >> 3;
  return base +
         static_cast<uint32_t>(chunk * kTileBytes + row * 128 + (((unit & 7) ^ (row & 7)) << 4));
}

// The tile's query rows into `q` by cp.async from `threads` threads (rows past t.rows zeros);
// the caller commits and waits.
__device__ __forceinline__ void LoadQueries(const gpu::AttentionTile& t, uint32_t q,
                                            int threads) {
  for (int i = threadIdx.x; i < gpu::kAttentionTileRows * kChunks * 8; i += threads) {
    const int row = i / (kChunks * 8);
    const int unit = i % (kChunks * 8);
    const bool valid = row < t.rows;
    const char* src = reinterpret_cast<const char*>(t.q) +
                      (valid ? (static_cast<int64_t>(row) * kDk + unit * 8) * 2 : 0);
    CopyAsync16(TileUnit(q, row, unit), src, valid);
  }
}

}  // namespace mlaserve::cuda::latent

#endif  // MLASERVE_KERNELS_CUDA_LATENT_TILES_CUH_
