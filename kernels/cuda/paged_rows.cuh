#ifndef MLASERVE_KERNELS_CUDA_PAGED_ROWS_CUH_
#define MLASERVE_KERNELS_CUDA_PAGED_ROWS_CUH_

// Where a tile's keys are in a paged cache. The block table is read from global memory once
// per thread block into shared memory (its first kSharedTablePages entries), so that issuing a
// block's loads waits on no dependent global read: a key's row address is then arithmetic.

#include <cstdint>

#include "kernels/gpu/gpu_jobs.h"

namespace mlaserve::cuda {

inline constexpr int kSharedTablePages = 256;  // 16,384 keys in 64-token pages

// The tile's block table into `table` by `threads` threads; a barrier must follow before use.
__device__ __forceinline__ void StagePageTable(const gpu::AttentionTile& t, int32_t* table,
                                               int threads) {
  if (t.keys <= 0) return;
  const int pages = (t.first_token + t.keys - 1) / t.page_size + 1;
  const int32_t* global = reinterpret_cast<const int32_t*>(t.pages);
  for (int i = threadIdx.x; i < pages && i < kSharedTablePages; i += threads) table[i] = global[i];
}

// The start of key `token`'s page row (page p at base + p * page_stride).
__device__ __forceinline__ const char* PageOf(const gpu::AttentionTile& t, const int32_t* table,
                                              int token, int* row) {
  const int position = t.first_token + token;
  const int index = position / t.page_size;
  *row = position - index * t.page_size;
  const int page =
      index < kSharedTablePages ? table[index] : reinterpret_cast<const int32_t*>(t.pages)[index];
  return reinterpret_cast<const char*>(t.base) + static_cast<int64_t>(page) * t.page_stride;
}

}  // namespace mlaserve::cuda

#endif  // MLASERVE_KERNELS_CUDA_PAGED_ROWS_CUH_
