#ifndef MLASERVE_KERNELS_CUDA_MMA_PRIMITIVES_CUH_
#define MLASERVE_KERNELS_CUDA_MMA_PRIMITIVES_CUH_

// The few PTX instructions the kernels are built from (sm_80 and later): asynchronous copies
// into shared memory, ldmatrix, and the bf16 m16n8k16 tensor-core MMA with fp32
// accumulation. Fragment layouts are PTX's (mma.m16n8k16, "Matrix Fragments"): a thread
// holds C elements (row lane/4, cols 2 (lane%4) + {0,1}) and the same 8 rows further.

#include <cuda_bf16.h>

#include <cstdint>

namespace mlaserve::cuda {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, or 16 zero bytes when !valid (nothing is read).
__device__ __forceinline__ void CopyAsync16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void CopyAsync4(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void CopyAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CopyAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void LoadMatrixX2(uint32_t (&r)[2], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(address));
}
__device__ __forceinline__ void LoadMatrixX4Trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// c += a . b for one m16n8k16 tile: a the A fragment (4 registers), b0/b1 the B fragment.
__device__ __forceinline__ void MmaBf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A tile of rows of `kChunks` 16-byte chunks (kChunks a multiple of 8) in shared memory,
// with each chunk index XOR-ed by the row within its group of 8 chunks: the 8 rows an
// ldmatrix reads at one column then fall in 8 different bank groups.
template <int kChunks>
__device__ __forceinline__ uint32_t SwizzledChunk(uint32_t base, int row, int chunk) {
  static_assert(kChunks % 8 == 0, "rows must be whole 128-byte groups");
  return base + static_cast<uint32_t>((row * kChunks + ((chunk & ~7) | ((chunk ^ row) & 7))) * 16);
}

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace mlaserve::cuda

#endif  // MLASERVE_KERNELS_CUDA_MMA_PRIMITIVES_CUH_
