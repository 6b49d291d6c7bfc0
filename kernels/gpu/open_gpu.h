#ifndef MLASERVE_KERNELS_GPU_OPEN_GPU_H_
#define MLASERVE_KERNELS_GPU_OPEN_GPU_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/gpu/gpu_runtime.h"

namespace mlaserve::gpu {

// Whether `name` names a GPU ("cuda:N"; "fake-gpu", host memory, for tests and CI smoke runs).
bool IsGpuName(absl::string_view name);

// Opens the GPU `name` names. INVALID_ARGUMENT for another name, UNIMPLEMENTED for cuda:N in
// a build without CUDA (configure with -DMLASERVE_CUDA=ON), NOT_FOUND for a GPU that is not
// there.
absl::StatusOr<std::unique_ptr<GpuRuntime>> OpenGpu(absl::string_view name);

// "NVIDIA H100 80GB HBM3 (cuda:0, sm_90, 132 SMs, 79.1 GiB, driver 580.159.04)": what start-up
// lines and bench headers print.
std::string DescribeGpu(const DeviceProperties& properties);

// The CUDA GPU `ordinal`: kernels/cuda/ in builds with CUDA, UNIMPLEMENTED otherwise.
absl::StatusOr<std::unique_ptr<GpuRuntime>> OpenCudaGpu(int ordinal);

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_OPEN_GPU_H_
