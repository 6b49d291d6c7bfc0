#include "kernels/gpu/gpu_batch_executor.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "common/status_macros.h"

namespace mlaserve::gpu {
namespace {

// The answers of one run, in the pinned memory they were downloaded into.
class DownloadedBuffers final : public BatchBuffers {
 public:
  DownloadedBuffers(const BatchSteps& steps, const BatchLayout& layout, HostBuffer download)
      : download_(std::move(download)), spans_(steps.buffers.size()) {
    for (size_t i = 0; i < steps.buffers.size(); ++i) {
      const StepBuffer& b = steps.buffers[i];
      if (b.kind != StepBuffer::Kind::kOutput) continue;
      spans_[i] = {download_.data + layout.buffer_offsets[i],
                   static_cast<size_t>(b.elements * ElementBytes(b.type))};
    }
  }
  std::span<const std::byte> Bytes(int buffer) const override { return spans_[buffer]; }

 private:
  HostBuffer download_;
  std::vector<std::span<const std::byte>> spans_;
};

// Grows by at least half again, so a slowly growing batch does not reallocate every time.
int64_t Grown(int64_t have, int64_t need) { return std::max(need, have + have / 2); }

}  // namespace

GpuBatchExecutor::~GpuBatchExecutor() {
  if (arena_ != 0) runtime_.Free(arena_);
}

absl::Status GpuBatchExecutor::EnsureHost(HostBuffer& buffer, int64_t bytes) {
  if (buffer.bytes >= bytes && buffer.owner.use_count() <= 1) return absl::OkStatus();
  // A buffer still held by an earlier run's answers is replaced by one of the same size when
  // that is enough: growing it on every hold would double a caller's pinned memory each time
  // it keeps one result while running the next.
  const int64_t size =
      buffer.bytes >= bytes ? buffer.bytes : Grown(buffer.bytes, std::max<int64_t>(bytes, 1));
  ASSIGN_OR_RETURN(buffer, runtime_.AllocateHost(size));
  return absl::OkStatus();
}

absl::StatusOr<GpuBatchExecutor::Result> GpuBatchExecutor::Run(const BatchSteps& steps,
                                                               const InputResolver& resolve,
                                                               std::span<const UploadCopy> copies) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const BatchLayout layout, LayOutBatch(
                                                 steps, copies,
                                                 [this](const void* data, int64_t bytes) {
                                                   return runtime_.ReadsInPlace(data, bytes);
                                                 },
                                                 in_place_min_bytes_));
  if (layout.arena_bytes > arena_bytes_) {
    const int64_t bytes = Grown(arena_bytes_, layout.arena_bytes);
    if (arena_ != 0) runtime_.Free(std::exchange(arena_, 0));
    arena_bytes_ = 0;
    ASSIGN_OR_RETURN(arena_, runtime_.Allocate(bytes, "batch arena"));
    arena_bytes_ = bytes;
  }
  RETURN_IF_ERROR(EnsureHost(upload_, layout.upload_bytes));
  RETURN_IF_ERROR(EnsureHost(download_, layout.download_bytes));
  ASSIGN_OR_RETURN(
      const Program program,
      LowerBatch(steps, layout, arena_, resolve,
                 std::span<std::byte>(upload_.data, static_cast<size_t>(upload_.bytes)), copies));
  const double lowering_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  const ProgramIo io{
      std::span<const std::byte>(upload_.data, static_cast<size_t>(program.upload_bytes)),
      std::span<std::byte>(download_.data, static_cast<size_t>(program.download_bytes))};
  ASSIGN_OR_RETURN(const ProgramTiming timing, runtime_.Run(program, io));
  Result result;
  result.buffers = std::make_unique<DownloadedBuffers>(steps, layout, download_);
  result.timing = timing;
  result.lowering_us = lowering_us;
  result.upload_bytes = program.upload_bytes;
  result.query_bytes = program.query_bytes;
  result.copied_bytes = program.copied_bytes;
  result.in_place_bytes = program.in_place_bytes;
  result.download_bytes = program.download_bytes;
  result.launches = static_cast<int>(program.launches.size());
  return result;
}

}  // namespace mlaserve::gpu
