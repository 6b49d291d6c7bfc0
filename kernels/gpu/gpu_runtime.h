#ifndef MLASERVE_KERNELS_GPU_GPU_RUNTIME_H_
#define MLASERVE_KERNELS_GPU_GPU_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/gpu/gpu_program.h"

namespace mlaserve::gpu {

// What a device says of itself, for GetServerInfo, /metrics, logs and bench headers.
struct DeviceProperties {
  std::string name;  // "NVIDIA H100 80GB HBM3"
  int ordinal = 0;
  int sm_count = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int64_t total_memory = 0;  // bytes
  std::string driver;        // "580.159.04", or the runtime's version where the driver has none
  // Peak rates the TyphoonMLA threshold balances (dense bf16 matrix FLOP/s, memory bytes/s).
  double bf16_tflops = 0;
  double hbm_tbps = 0;
  // What the runtime's kernels attain (dense bf16 FLOP/s): the absorb pass's latent-cache
  // kernel and the naive pass's kernel over expanded heads; 0 where unknown (the threshold then
  // takes the peak and assumes the naive pass's math hides under its reads).
  double absorb_tflops = 0;
  double naive_tflops = 0;
  // Query rows a thread block of the naive pass's kernel takes at a time: 128 where a dense
  // launch's pairs of tiles run in one block (Hopper's expanded-heads kernel); 0: a tile's.
  int dense_unit_rows = 0;
};

// The CUDA kernels' attained rates as fractions of the bf16 peak, measured on an H200
// (docs/performance.md 18: `mlaserve-bench typhoon --device=cuda:0 --shared 4096 --suffix 512
// --batch 512`), which the CUDA runtime states as absorb_tflops and naive_tflops: the seesaw
// latent kernel (412-423 of 1,070 TFLOP/s), the plain warpgroup one (about 280) and mma.sync's
// (170, `mlaserve-bench kernel` at 16K keys); the naive pass on the expanded-heads warpgroup
// kernel (219) and on mma.sync (101-111).
inline constexpr double kSeesawAbsorbShare = 0.385;
inline constexpr double kWgmmaAbsorbShare = 0.26;
inline constexpr double kMmaAbsorbShare = 0.16;
inline constexpr double kExpandedNaiveShare = 0.205;
inline constexpr double kMmaNaiveShare = 0.094;

struct MemoryInfo {
  int64_t free = 0;
  int64_t total = 0;
};

// Host memory a device copies to and from at full rate (pinned on a real GPU). Freed with
// the last copy of the handle.
struct HostBuffer {
  std::byte* data = nullptr;
  int64_t bytes = 0;
  std::shared_ptr<void> owner;
};

// One GPU as the plain C++ parts see it: device memory, copies, and programs (gpu_program.h)
// run to completion. Two implementations: CudaRuntime (kernels/cuda/, only where CUDA is
// built) and FakeGpuRuntime (fake_gpu_runtime.h), which executes each launch with the host
// kernels so that every lowering is tested on machines without a GPU.
//
// A runtime is used by one thread at a time. Once a fault has made the device untrustworthy
// (a sticky CUDA error: an illegal address, an ECC error, a lost device), health() says so
// and every later call fails with it: nothing computed after the fault is returned.
class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;

  virtual const DeviceProperties& properties() const = 0;
  virtual absl::StatusOr<MemoryInfo> Memory() = 0;

  // RESOURCE_EXHAUSTED when the device has no room; `what` names the allocation in errors.
  virtual absl::StatusOr<DevicePtr> Allocate(int64_t bytes, absl::string_view what) = 0;
  virtual void Free(DevicePtr ptr) = 0;
  virtual absl::StatusOr<HostBuffer> AllocateHost(int64_t bytes) = 0;

  // Host memory the device reads in place at its own address (pinned and mapped into the
  // device's address space: cudaHostRegister on a real GPU), so that a batch's queries in it
  // reach the device by the copy launch's reads instead of a copy into the upload first
  // (gpu_lowering.h). The mapping ends when the last copy of the handle goes; the memory must
  // stay mapped until then. Callable from any thread. UNIMPLEMENTED where the device cannot
  // (the caller then copies, as for any other memory).
  virtual absl::StatusOr<std::shared_ptr<void>> MapHost(const void* data, int64_t bytes) = 0;
  // Whether [data, data + bytes) lies in memory mapped by MapHost whose handle is held.
  virtual bool ReadsInPlace(const void* data, int64_t bytes) const = 0;

  // Synchronous copies (set-up: weights, snapshots of device memory in tests).
  virtual absl::Status CopyToDevice(DevicePtr dst, const void* src, int64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, DevicePtr src, int64_t bytes) = 0;

  // Uploads io.upload to program.upload_to, runs the launches in order, downloads
  // program.download_from into io.download, and returns once all of it is done.
  virtual absl::StatusOr<ProgramTiming> Run(const Program& program, const ProgramIo& io) = 0;

  // OK, or the fault that took the device out (UNAVAILABLE naming it); sticky.
  virtual absl::Status health() const = 0;
};

}  // namespace mlaserve::gpu

#endif  // MLASERVE_KERNELS_GPU_GPU_RUNTIME_H_
