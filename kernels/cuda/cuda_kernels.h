#ifndef MLASERVE_KERNELS_CUDA_CUDA_KERNELS_H_
#define MLASERVE_KERNELS_CUDA_CUDA_KERNELS_H_

// The CUDA kernels behind a program's launches (kernels/gpu/gpu_program.h), one entry point a
// kind. Each enqueues on `stream` and returns the launch's own error (cudaErrorNotSupported
// for an attention shape without a kernel); what happens on the device shows at the next
// synchronisation.

#include <cuda_runtime_api.h>

#include "kernels/gpu/gpu_program.h"

namespace mlaserve::cuda {

// Once per device before the first launch: the kernels' shared-memory limits.
cudaError_t PrepareAttentionKernels();

// Attention tiles over the latent cache (bf16, dk 576, dv 512), its FP8 form (SnapMLA's
// layout, same widths) and expanded heads (dense, dk 192, dv 128), on mma.sync (sm_80 on).
// With `narrow`, a launch NarrowAttentionTakes (the latent cache, bf16 or FP8, whose tiles hold
// at most 16 rows: Launch::max_tile_rows) runs the kernel's narrow shape: one row of eight
// warps over 16 rows instead of 4 x 2 over 64, and a ring of three raw FP8 buffers (two blocks
// in flight while one is widened) instead of one.
cudaError_t EnqueueAttention(const gpu::Launch& launch, bool narrow, cudaStream_t stream);
bool NarrowAttentionTakes(const gpu::Launch& launch);

// The bf16 latent cache's tiles on Hopper's warpgroup MMA (attention_wgmma_kernel.cu), where
// the build has sm_90a code and the device is a Hopper part (WgmmaAttentionRuns).
cudaError_t PrepareWgmmaAttentionKernel();
bool WgmmaAttentionRuns(int compute_major, int compute_minor);
cudaError_t EnqueueWgmmaAttention(const gpu::Launch& launch, cudaStream_t stream);
// The bf16 latent cache's tiles over whole key blocks of one pool (Launch::key_pool_rows > 0)
// on Hopper: blocks fetched by the bulk tensor copy, two warpgroups taking turns
// (attention_seesaw_kernel.cu). Prepare finds the driver's tensor-map encoder (kept by the
// caller, passed to each Enqueue); cudaErrorNotSupported where the driver lacks it.
cudaError_t PrepareSeesawAttentionKernel(void** encode_tensor_map);
cudaError_t EnqueueSeesawAttention(const gpu::Launch& launch, void* encode_tensor_map,
                                   cudaStream_t stream);
// Expanded heads (dense, dk 192, dv 128: TyphoonMLA's naive pass) on Hopper's warpgroup MMA
// (attention_expanded_kernel.cu), where WgmmaAttentionRuns; cudaErrorNotSupported for another
// shape.
cudaError_t PrepareExpandedAttentionKernel();
cudaError_t EnqueueExpandedAttention(const gpu::Launch& launch, cudaStream_t stream);
cudaError_t EnqueueGemm(const gpu::Launch& launch, cudaStream_t stream);
// A kGemm launch with gemv_rows > 0 on the row kernel (gemv_kernel.cu).
cudaError_t EnqueueGemv(const gpu::Launch& launch, cudaStream_t stream);
cudaError_t EnqueueCombine(const gpu::Launch& launch, cudaStream_t stream);
cudaError_t EnqueueCopyRows(const gpu::Launch& launch, cudaStream_t stream);
cudaError_t EnqueueFill(const gpu::Launch& launch, cudaStream_t stream);

// A kernel that traps: the device then fails as after an Xid fault (the fault tests).
cudaError_t EnqueueTrap(cudaStream_t stream);

}  // namespace mlaserve::cuda

#endif  // MLASERVE_KERNELS_CUDA_CUDA_KERNELS_H_
