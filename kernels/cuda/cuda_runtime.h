#ifndef MLASERVE_KERNELS_CUDA_CUDA_RUNTIME_H_
#define MLASERVE_KERNELS_CUDA_CUDA_RUNTIME_H_

#include <memory>
#include <mutex>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/launch_graphs.h"
#include "kernels/gpu/gpu_runtime.h"
#include "kernels/gpu/host_mappings.h"

namespace mlaserve::cuda {

// Which kernels the bf16 latent cache's attention may use. kBest: on Hopper the seesaw kernel
// for launches over whole key blocks (Launch::key_pool_rows) and the warpgroup-MMA kernel for
// the rest; elsewhere mma.sync. kWgmma and kMma hold it to those (to compare them).
enum class AttentionKernels { kBest, kWgmma, kMma };

// How a runtime runs programs; the defaults are the fastest, the rest are there to compare.
struct CudaOptions {
  AttentionKernels attention = AttentionKernels::kBest;
  // Projections whose jobs have a few rows (Launch::gemv_rows) on the row kernel
  // (gemv_kernel.cu) rather than the tiled GEMM.
  bool row_kernel = true;
  // Launch sequences seen before replayed as CUDA graphs (launch_graphs.h); 0: none.
  int graphs = 64;
  // MapHost pins and maps host memory (the data plane's regions), whose queries the copy
  // launch then reads in place; off: MapHost is UNIMPLEMENTED and they are copied.
  bool map_host = true;
  // FP8 latent-cache launches whose tiles hold at most 16 rows (few heads) on mma.sync's
  // narrow shape, which does 16 rows' work where the full one does 64's (with kMma the bf16
  // cache's too); off: the full shape.
  bool narrow = true;

  // MLASERVE_CUDA_ATTENTION=wgmma or =mma, MLASERVE_CUDA_ROW_KERNEL=off,
  // MLASERVE_CUDA_GRAPHS=off, MLASERVE_CUDA_MAP_HOST=off, MLASERVE_CUDA_NARROW=off; the
  // defaults otherwise.
  static CudaOptions FromEnvironment();
};

// Launches run so far, by kernel, and how the sequences ran.
struct LaunchCounts {
  int64_t seesaw = 0;
  int64_t wgmma = 0;
  int64_t expanded = 0;  // expanded heads on the warpgroup MMA
  int64_t narrow = 0;    // mma.sync's narrow shape (tiles of at most 16 rows)
  int64_t mma = 0;
  int64_t gemm = 0;  // the tiled GEMM
  int64_t gemv = 0;  // the row kernel
  int64_t graphs_captured = 0;
  int64_t graph_replays = 0;  // programs whose launches were one graph launch
};

// One CUDA GPU behind the GpuRuntime interface: device memory from cudaMalloc, pinned host
// memory from cudaHostAlloc, and a program run on one stream of its own: the upload, the
// launches (kernels/cuda/cuda_kernels.h; a sequence seen before as one CUDA graph), CUDA
// events around them, the download, then one synchronisation.
//
// Errors: an allocation the device has no room for is RESOURCE_EXHAUSTED and changes nothing;
// a launch that has no kernel is UNIMPLEMENTED. Any other CUDA error (an illegal address, a
// trap, an ECC error, a lost device) makes the runtime unhealthy for good: the run fails with
// UNAVAILABLE naming the error, and so does every later call, so that nothing computed after
// a fault is ever returned.
class CudaRuntime final : public gpu::GpuRuntime {
 public:
  // NOT_FOUND when there is no such device (or no driver).
  static absl::StatusOr<std::unique_ptr<CudaRuntime>> Create(
      int ordinal, CudaOptions options = CudaOptions::FromEnvironment());
  ~CudaRuntime() override;

  const gpu::DeviceProperties& properties() const override { return properties_; }
  absl::StatusOr<gpu::MemoryInfo> Memory() override;
  absl::StatusOr<gpu::DevicePtr> Allocate(int64_t bytes, absl::string_view what) override;
  void Free(gpu::DevicePtr ptr) override;
  absl::StatusOr<gpu::HostBuffer> AllocateHost(int64_t bytes) override;
  // cudaHostRegister (mapped, portable); UNIMPLEMENTED where the driver refuses the memory or
  // maps it at another device address than its host one.
  absl::StatusOr<std::shared_ptr<void>> MapHost(const void* data, int64_t bytes) override;
  bool ReadsInPlace(const void* data, int64_t bytes) const override;
  absl::Status CopyToDevice(gpu::DevicePtr dst, const void* src, int64_t bytes) override;
  absl::Status CopyToHost(void* dst, gpu::DevicePtr src, int64_t bytes) override;
  absl::StatusOr<gpu::ProgramTiming> Run(const gpu::Program& program,
                                         const gpu::ProgramIo& io) override;
  absl::Status health() const override;

  // Runs a kernel that traps, as a faulting GPU would: the fault tests' injection.
  absl::Status InjectTrap();

  // Read between runs (Run updates it).
  const LaunchCounts& launch_counts() const { return counts_; }
  // OK, or why CUDA graphs were turned off (a capture the driver refused).
  const absl::Status& graphs_off() const { return graphs_off_; }

 private:
  struct Handles;
  // The kernel each kind of launch runs on.
  enum class Route {
    kCopyRows,
    kFill,
    kGemm,
    kGemv,
    kSeesaw,
    kWgmma,
    kExpanded,
    kNarrow,
    kMma,
    kCombine
  };
  CudaRuntime(int ordinal, CudaOptions options, std::unique_ptr<Handles> handles);
  Route RouteOf(const gpu::Launch& launch) const;
  // Enqueues the launches one by one; UNIMPLEMENTED for a launch without a kernel.
  absl::Status EnqueueLaunches(std::span<const gpu::Launch> launches);
  // The same through a CUDA graph where the sequence has been seen before.
  absl::Status EnqueueThroughGraphs(std::span<const gpu::Launch> launches);
  absl::StatusOr<cudaGraphExec_t> Capture(std::span<const gpu::Launch> launches);
  // OK for cudaSuccess; otherwise the status `what` failed with, marking the device faulty
  // unless the error leaves it usable.
  absl::Status Check(int error, absl::string_view what);

  int ordinal_;
  CudaOptions options_;
  // The bf16 latent cache's attention on the warpgroup MMA kernels (Hopper, not kMma).
  bool wgmma_attention_ = false;
  // The seesaw kernel's tensor-map encoder (the driver's cuTensorMapEncodeTiled), or null
  // where that kernel is not to run (kWgmma, not Hopper, a driver without it).
  void* encode_tensor_map_ = nullptr;
  LaunchCounts counts_;
  std::unique_ptr<Handles> handles_;
  std::unique_ptr<LaunchGraphs> graphs_;  // null where options_.graphs is 0
  absl::Status graphs_off_;               // why graphs were turned off after a capture failed
  gpu::DeviceProperties properties_;
  std::shared_ptr<gpu::HostMappings> mapped_ = std::make_shared<gpu::HostMappings>();
  // Set once by the runtime's thread, read by any (health()).
  mutable std::mutex fault_mu_;
  absl::Status fault_;  // guarded by fault_mu_ for readers on other threads
};

}  // namespace mlaserve::cuda

#endif  // MLASERVE_KERNELS_CUDA_CUDA_RUNTIME_H_
