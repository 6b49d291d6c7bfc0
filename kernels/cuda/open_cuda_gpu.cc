#include "kernels/cuda/cuda_runtime.h"
#include "kernels/gpu/open_gpu.h"

namespace mlaserve::gpu {

absl::StatusOr<std::unique_ptr<GpuRuntime>> OpenCudaGpu(int ordinal) {
  absl::StatusOr<std::unique_ptr<cuda::CudaRuntime>> runtime = cuda::CudaRuntime::Create(ordinal);
  if (!runtime.ok()) return runtime.status();
  return std::unique_ptr<GpuRuntime>(std::move(*runtime));
}

}  // namespace mlaserve::gpu
