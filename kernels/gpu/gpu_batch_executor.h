#ifndef MLASERVE_KERNELS_GPU_GPU_BATCH_EXECUTOR_H_
#define MLASERVE_KERNELS_GPU_GPU_BATCH_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "kernels/gpu/gpu_lowering.h"
#include "kernels/gpu/gpu_runtime.h"
#include "kernels/mla/batch_steps.h"

namespace mlaserve::gpu {

// Runs batches' steps on one GPU: lays each out in a device arena that grows to the largest
// batch seen and is then reused, lowers it (gpu_lowering.h) into pinned upload memory (queries
// in host memory the runtime maps, GpuRuntime::MapHost, are read from there instead), runs
// the program, and hands back the answers, downloaded into pinned host memory. One Run at a
// time; the buffers of a run stay valid after the next one starts.
class GpuBatchExecutor {
 public:
  // Queries in mapped host memory are read in place from `in_place_min_bytes` a batch
  // (gpu_lowering.h).
  explicit GpuBatchExecutor(GpuRuntime& runtime, int64_t in_place_min_bytes = kInPlaceMinBytes)
      : runtime_(runtime), in_place_min_bytes_(in_place_min_bytes) {}
  ~GpuBatchExecutor();
  GpuBatchExecutor(const GpuBatchExecutor&) = delete;
  GpuBatchExecutor& operator=(const GpuBatchExecutor&) = delete;

  struct Result {
    // The answers (kOutput buffers); inputs and scratch read as empty.
    std::unique_ptr<BatchBuffers> buffers;
    ProgramTiming timing;
    double lowering_us = 0;    // the host's part before the upload: layout, records, staging
    int64_t upload_bytes = 0;  // host to device, all of it: records, queries, copies
    int64_t query_bytes = 0;
    int64_t copied_bytes = 0;
    int64_t in_place_bytes = 0;  // queries read from mapped host memory (not uploaded)
    int64_t download_bytes = 0;
    int launches = 0;
  };
  absl::StatusOr<Result> Run(const BatchSteps& steps, const InputResolver& resolve,
                             std::span<const UploadCopy> copies = {});

  int64_t arena_bytes() const { return arena_bytes_; }

 private:
  // `buffer` holds at least `bytes` and nobody else still reads it.
  absl::Status EnsureHost(HostBuffer& buffer, int64_t bytes);

  GpuRuntime& runtime_;
  const int64_t in_place_min_bytes_;
  DevicePtr arena_ = 0;
  int64_t arena_bytes_ = 0;
  HostBuffer upload_;
  HostBuffer download_;
};

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_GPU_BATCH_EXECUTOR_H_
