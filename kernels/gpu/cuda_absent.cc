// OpenCudaGpu in a build without CUDA (cmake/Cuda.cmake); kernels/cuda/open_cuda_gpu.cc is
// the one with it.
#include "absl/strings/str_cat.h"
#include "kernels/gpu/open_gpu.h"

namespace mlaserve::gpu {

absl::StatusOr<std::unique_ptr<GpuRuntime>> OpenCudaGpu(int ordinal) {
  return absl::UnimplementedError(
      absl::StrCat("cuda:", ordinal,
                   ": this build has no CUDA device (configure with -DMLASERVE_CUDA=ON "
                   "where nvcc is installed: docs/gpu.md)"));
}

}  // namespace mlaserve::gpu
