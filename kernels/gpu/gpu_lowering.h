#ifndef MLASERVE_KERNELS_GPU_GPU_LOWERING_H_
#define MLASERVE_KERNELS_GPU_GPU_LOWERING_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/gpu/gpu_program.h"
#include "kernels/gpu/gpu_runtime.h"
#include "kernels/mla/batch_steps.h"
#include "kernels/mla/decode_batch.h"

namespace mlaserve::gpu {

// Host bytes that must reach device memory before the batch's first step reads it: the rows
// appended or registered since the last batch (the device's copy of the page pool).
struct UploadCopy {
  const std::byte* src = nullptr;
  DevicePtr dst = 0;
  int64_t bytes = 0;
};

// Whether the device reads [data, data + bytes) of host memory in place
// (GpuRuntime::ReadsInPlace): a staged query there is read by the copy launch from where it
// is instead of being copied into the upload first.
using HostReadable = std::function<bool(const void* data, int64_t bytes)>;

// Queries are read in place only from this many bytes a batch: below it, copying them into
// the pinned upload (one memcpy, one DMA) costs less than the copy launch's reads across the
// bus, whose latency a few blocks cannot hide (on an H200: a lone query's 48 KiB took 10 us
// longer in place, 8 queries' 384 KiB 14 us less, 72 queries' 3.5 MB 330 us less).
inline constexpr int64_t kInPlaceMinBytes = int64_t{128} << 10;

// Where a batch's input buffers (the KV pool, the weights, expanded K/V) are in device
// memory. The device keeps them there across batches; an input it cannot place is an error,
// never a copy: INTERNAL naming the buffer.
using InputResolver = std::function<absl::StatusOr<DevicePtr>(const StepBuffer& buffer)>;

// The device memory one batch needs, in one arena:
//   [answers | scratch | uploaded bytes]
// answers first, so that one copy brings them all back.
struct BatchLayout {
  int64_t arena_bytes = 0;
  int64_t upload_offset = 0;  // from the arena's start
  int64_t upload_bytes = 0;
  int64_t download_bytes = 0;  // the answers: arena [0, download_bytes)
  // Per StepBuffer: its offset in the arena (scratch and outputs), -1 for inputs.
  std::vector<int64_t> buffer_offsets;
  // Per StageCopy: read in place from mapped host memory (not in the upload).
  std::vector<bool> staged_in_place;
};

// A batch's steps (kernels/mla/batch_steps.h) as one GPU program (gpu_program.h):
//   copy     the queries (StageCopy) and `copies`, packed into the upload, to their places;
//            queries in host memory the device reads in place (`in_place`) straight from it,
//            where they come to `in_place_min_bytes` or more
//   fill     scratch and outputs whose `fill` asks for zeros or -inf
//   then one launch per step: a projection as a grouped GEMM (64 x 64 tiles), an attention
//   step as one launch per kind of keys it reads (64 query rows a block), a combine as one
//   launch (8 rows a block).
// Row groups in which no row sees a key are left out, as the host runner leaves them, so
// their destinations keep the fill. Each step's semantics is batch_steps.h's; the GPU's
// answers equal the host's within floating-point tolerance, not bit for bit.
//
// Layout() sizes the arena; Lower() writes the program for an arena at `arena` and the
// upload bytes (layout.upload_bytes) into `upload`. INTERNAL for steps that fail
// ValidateBatchSteps or inputs the resolver cannot place.
// DecodeBatch's split-KV knobs as the GPU device sets them (parallel_units, the SM count,
// is the caller's): a unit takes a thread block's rows, parts are whole key blocks, waves
// are balanced and each part's fixed cost is counted; a dense pass's unit takes the rows
// `device`'s naive-pass kernel runs in one block. For batches built outside the engine (the
// benchmarks) to split as the server's do.
void UseGpuSplit(DecodeBatch& batch, const DeviceProperties& device);

absl::StatusOr<BatchLayout> LayOutBatch(const BatchSteps& steps,
                                        std::span<const UploadCopy> copies = {},
                                        const HostReadable& in_place = nullptr,
                                        int64_t in_place_min_bytes = kInPlaceMinBytes);
absl::StatusOr<Program> LowerBatch(const BatchSteps& steps, const BatchLayout& layout,
                                   DevicePtr arena, const InputResolver& resolve,
                                   std::span<std::byte> upload,
                                   std::span<const UploadCopy> copies = {});

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_GPU_LOWERING_H_
