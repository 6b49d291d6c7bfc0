#ifndef MLASERVE_KERNELS_CUDA_TMA_CUH_
#define MLASERVE_KERNELS_CUDA_TMA_CUH_

// Hopper's bulk tensor copy (TMA) and the synchronisation around it (sm_90): a tile of a 2-D
// tensor described by a CUtensorMap lands in shared memory, laid out with the map's swizzle,
// and completes a transaction count on an mbarrier that consumers wait on by phase parity
// (PTX ISA: "cp.async.bulk.tensor", "mbarrier"). Named barriers let two warpgroups hand work
// to each other without stopping the whole block.

#include <cstdint>

namespace mlaserve::cuda {

__device__ __forceinline__ void MbarrierInit(uint32_t barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals));
}
// Makes initialised barriers visible to the async proxy (the copy engine) before first use.
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Shared memory written by ordinary stores (and cp.async) becomes visible to the async proxy
// (the tensor cores' reads, the bulk copies, barriers as the copy engine sees them) only after
// this, in each writing thread, before the barrier.
__device__ __forceinline__ void FenceSharedForAsyncProxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// One arrival that also announces `bytes` the copies will complete on the barrier.
__device__ __forceinline__ void MbarrierExpectBytes(uint32_t barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier),
               "r"(bytes)
               : "memory");
}
// Until the barrier's phase `parity` has completed.
__device__ __forceinline__ void MbarrierWait(uint32_t barrier, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
}

// `bytes` (a multiple of 16) from global `src` to shared `dst` (both 16-byte aligned) by the
// bulk copy, completing them on `barrier`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(barrier)
      : "memory");
}

// `bytes` (a multiple of 16) from shared `src` to global `dst` (both 16-byte aligned) by the
// bulk copy, in this thread's current bulk group; BulkStoreWait before `src` is written again
// or the block exits.
__device__ __forceinline__ void BulkStore(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}
// Until the copy engine has read every bulk store this thread issued.
__device__ __forceinline__ void BulkStoreWait() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// An L2 policy for data read once (a key block: whatever a later read of it would find in
// L2, it is better spent on the blocks still to come).
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void PrefetchTensorMap(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// The box at (x, y) (x the innermost coordinate, in elements) of the tensor `map` describes,
// into shared memory at `dst`, completing its bytes on `barrier`, under the L2 policy `policy`
// (EvictFirstPolicy).
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const void* map, int x, int y,
                                          uint32_t barrier, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(barrier), "l"(policy)
      : "memory");
}

// Barrier `id` (1-15; 0 is __syncthreads) of `threads` threads: Sync waits for all of them,
// Arrive counts this thread and goes on.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace mlaserve::cuda

#endif  // MLASERVE_KERNELS_CUDA_TMA_CUH_
