// Data movement inside a program: rows copied from the uploaded bytes to their places (the
// queries, KV rows written since the last program, an expansion's RoPE columns), and buffers
// filled with zeros or -inf. One thread block a job.

#include "kernels/cuda/cuda_kernels.h"

namespace mlaserve::cuda {
namespace {

using gpu::CopyRowsJob;
using gpu::FillJob;

constexpr int kThreads = 256;

// Vectors a thread loads before it stores any: independent loads in flight, where a loop of
// load-then-store waits out the memory's latency once a vector (a job of 147 KB on one block
// took 20 us so).
constexpr int kVectorsInFlight = 4;

__global__ void __launch_bounds__(kThreads)
    CopyRowsKernel(const CopyRowsJob* __restrict__ jobs, bool aligned16) {
  const CopyRowsJob j = jobs[blockIdx.x];
  const char* src = reinterpret_cast<const char*>(j.src);
  char* dst = reinterpret_cast<char*>(j.dst);
  if (aligned16) {
    const int vectors = j.row_bytes / 16;
    const int64_t total = static_cast<int64_t>(j.rows) * vectors;
    for (int64_t first = threadIdx.x; first < total; first += kThreads * kVectorsInFlight) {
      uint4 v[kVectorsInFlight];
#pragma unroll
      for (int u = 0; u < kVectorsInFlight; ++u) {
        const int64_t i = first + u * kThreads;
        if (i < total) {
          v[u] = reinterpret_cast<const uint4*>(src + (i / vectors) * j.src_stride)[i % vectors];
        }
      }
#pragma unroll
      for (int u = 0; u < kVectorsInFlight; ++u) {
        const int64_t i = first + u * kThreads;
        if (i < total)
          reinterpret_cast<uint4*>(dst + (i / vectors) * j.dst_stride)[i % vectors] = v[u];
      }
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
  int64_t vectors = 0;  // 16-byte stores where the job starts aligned
  if (j.dst % 16 == 0) {
    vectors = j.words / 4;
    const uint4 pattern = make_uint4(j.pattern, j.pattern, j.pattern, j.pattern);
    for (int64_t i = threadIdx.x; i < vectors; i += kThreads)
      reinterpret_cast<uint4*>(dst)[i] = pattern;
  }
  for (int64_t i = vectors * 4 + threadIdx.x; i < j.words; i += kThreads) dst[i] = j.pattern;
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
