#ifndef MLASERVE_KERNELS_GPU_FAKE_GPU_RUNTIME_H_
#define MLASERVE_KERNELS_GPU_FAKE_GPU_RUNTIME_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "kernels/gpu/gpu_runtime.h"
#include "kernels/gpu/host_mappings.h"

namespace mlaserve::gpu {

// A GPU made of host memory: every program runs launch by launch, each record executed with
// the host kernels (a GEMM tile with MatmulBf16, an attention tile with the AMLA rows kernel
// or SnapMLA's over the FP8 cache, a combine with CombineLseParts). It is how the GPU
// lowering, the device's memory (the page mirror, weights, expansions) and its fault
// handling are tested where there is no GPU: a launch that reads a page the device never
// received reads stale bytes, and every address a record names is checked against the
// allocations (INTERNAL naming the launch otherwise), where a real GPU would fault or read
// garbage.
class FakeGpuRuntime final : public GpuRuntime {
 public:
  struct Options {
    int64_t memory_bytes = int64_t{1} << 30;
    int sm_count = 4;
    double bf16_tflops = 100;
    double hbm_tbps = 1;
  };
  FakeGpuRuntime() : FakeGpuRuntime(Options{}) {}
  explicit FakeGpuRuntime(Options options);
  ~FakeGpuRuntime() override;

  const DeviceProperties& properties() const override { return properties_; }
  absl::StatusOr<MemoryInfo> Memory() override;
  absl::StatusOr<DevicePtr> Allocate(int64_t bytes, absl::string_view what) override;
  void Free(DevicePtr ptr) override;
  absl::StatusOr<HostBuffer> AllocateHost(int64_t bytes) override;
  // Any host memory: a launch may then read it as if it were device memory.
  absl::StatusOr<std::shared_ptr<void>> MapHost(const void* data, int64_t bytes) override;
  bool ReadsInPlace(const void* data, int64_t bytes) const override;
  absl::Status CopyToDevice(DevicePtr dst, const void* src, int64_t bytes) override;
  absl::Status CopyToHost(void* dst, DevicePtr src, int64_t bytes) override;
  absl::StatusOr<ProgramTiming> Run(const Program& program, const ProgramIo& io) override;
  absl::Status health() const override;

  // The device fails as a real one does after an Xid or ECC fault: the run in progress once
  // `runs_before` more programs have completed returns UNAVAILABLE with `reason`, and so does
  // every call after it.
  void InjectFault(std::string reason, int runs_before = 0);

  // Host-to-device bytes so far: uploads of programs and synchronous copies.
  int64_t bytes_to_device() const { return bytes_to_device_; }
  int64_t programs_run() const { return programs_run_; }
  int64_t allocated_bytes() const { return allocated_; }
  // The largest AllocateHost so far (pinned memory on a real GPU).
  int64_t largest_host_allocation() const { return largest_host_allocation_; }

 private:
  struct Allocation {
    int64_t bytes = 0;
    std::string what;
  };
  // [ptr, ptr + bytes) inside one allocation or one mapped host range, or INTERNAL naming
  // `what`.
  absl::StatusOr<std::byte*> Span(DevicePtr ptr, int64_t bytes, absl::string_view what) const;
  absl::Status Execute(const Launch& launch);

  DeviceProperties properties_;
  int64_t capacity_;
  int64_t allocated_ = 0;
  int64_t largest_host_allocation_ = 0;
  std::map<DevicePtr, Allocation> allocations_;
  std::shared_ptr<gpu::HostMappings> mapped_ = std::make_shared<gpu::HostMappings>();
  // Set once by the runtime's thread, read by any (health()).
  mutable std::mutex fault_mu_;
  absl::Status fault_;  // guarded by fault_mu_ for readers on other threads
  std::string pending_fault_;
  int runs_before_fault_ = -1;
  int64_t bytes_to_device_ = 0;
  int64_t programs_run_ = 0;
};

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_FAKE_GPU_RUNTIME_H_
