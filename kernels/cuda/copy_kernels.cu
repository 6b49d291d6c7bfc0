// Data movement inside a program: rows copied from the uploaded bytes to their places (the
// queries, KV rows written since the last program, an expansion's RoPE columns), and buffers
// filled with zeros or -inf. One thread block a job.

#include "kernels/cuda/cuda_kernels.h"

namespace mlaserve::cuda {
namespace {

using gpu::CopyRowsJob;
using gpu::FillJob;

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    CopyRowsKernel(const CopyRowsJob* __restrict__ jobs, bool aligned16) {
  const CopyRowsJob j = jobs[blockIdx.x];
  const char* src = reinterpret_cast<const char*>(j.src);
  char* dst = reinterpret_cast<char*>(j.dst);
  if (aligned16) {
    const int vectors = j.row_bytes / 16;
    const int64_t total = static_cast<int64_t>(j.rows) * vectors;
    for (int64_t i = threadIdx.x; i < total; i += kThreads) {
      const int64_t r = i / vectors;
      const int64_t v = i % vectors;
      reinterpret_cast<uint4*>(dst + r * j.dst_stride)[v] =
          reinterpret_cast<const uint4*>(src + r * j.src_stride)[v];
    }
    return;
  }
  const int64_t total = static_cast<int64_t>(j.rows) * j.row_bytes;
  for (int64_t i = threadIdx.x; i < total; i += kThreads) {
    const int64_t r = i / j.row_bytes;
    const int64_t b = i % j.row_bytes;
    dst[r * j.dst_stride + b] = src[r * j.src_stride + b];
  }
}

__global__ void __launch_bounds__(kThreads) FillKernel(const FillJob* __restrict__ jobs) {
  const FillJob j = jobs[blockIdx.x];
  uint32_t* dst = reinterpret_cast<uint32_t*>(j.dst);
  for (int64_t i = threadIdx.x; i < j.words; i += kThreads) dst[i] = j.pattern;
}

__global__ void TrapKernel() { __trap(); }

}  // namespace

cudaError_t EnqueueCopyRows(const gpu::Launch& launch, cudaStream_t stream) {
  CopyRowsKernel<<<launch.count, kThreads, 0, stream>>>(
      reinterpret_cast<const CopyRowsJob*>(launch.tiles), launch.aligned16);
  return cudaGetLastError();
}

cudaError_t EnqueueFill(const gpu::Launch& launch, cudaStream_t stream) {
  FillKernel<<<launch.count, kThreads, 0, stream>>>(reinterpret_cast<const FillJob*>(launch.tiles));
  return cudaGetLastError();
}

cudaError_t EnqueueTrap(cudaStream_t stream) {
  TrapKernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace mlaserve::cuda
