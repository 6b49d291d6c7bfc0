#include "kernels/cuda/cuda_runtime.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_kernels.h"

namespace mlaserve::cuda {
namespace {

// Dense bf16 matrix FLOPs per SM per clock: sm_80's tensor cores do 1,024 FMAs a clock, Hopper's
// 2,048 (NVIDIA's A100 and H100 whitepapers).
double Bf16FlopsPerSmClock(int major) { return major >= 9 ? 4096.0 : 2048.0; }

// The kernel module's version ("580.159.04"): the first word of /proc's line that looks like
// one (digits and dots); the driver API's version where /proc has none.
std::string DriverVersion() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (std::getline(in, line)) {
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      if (word.find('.') != std::string::npos &&
          word.find_first_not_of("0123456789.") == std::string::npos) {
        return word;
      }
    }
  }
  int version = 0;
  cudaDriverGetVersion(&version);
  return absl::StrCat("CUDA driver API ", version / 1000, ".", (version % 1000) / 10);
}

// Errors after which the context still works: the call failed, nothing ran.
bool Recoverable(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation:
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorNotSupported:
    // A graph capture the driver refused: the launches were not made, the device is fine.
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorCapturedEvent:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct CudaRuntime::Handles {
  cudaStream_t stream = nullptr;
  cudaEvent_t launched = nullptr;  // after the upload, before the first launch
  cudaEvent_t computed = nullptr;  // after the last launch
  cudaEvent_t started = nullptr;
  cudaEvent_t finished = nullptr;
};

CudaOptions CudaOptions::FromEnvironment() {
  const auto variable = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value == nullptr ? "" : value);
  };
  CudaOptions options;
  const std::string attention = variable("MLASERVE_CUDA_ATTENTION");
  if (attention == "wgmma") options.attention = AttentionKernels::kWgmma;
  if (attention == "mma") options.attention = AttentionKernels::kMma;
  if (variable("MLASERVE_CUDA_ROW_KERNEL") == "off") options.row_kernel = false;
  if (variable("MLASERVE_CUDA_GRAPHS") == "off") options.graphs = 0;
  if (variable("MLASERVE_CUDA_MAP_HOST") == "off") options.map_host = false;
  if (variable("MLASERVE_CUDA_NARROW") == "off") options.narrow = false;
  return options;
}

absl::StatusOr<std::unique_ptr<CudaRuntime>> CudaRuntime::Create(int ordinal, CudaOptions options) {
  const AttentionKernels kernels = options.attention;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || ordinal < 0 || ordinal >= count) {
    cudaGetLastError();
    return absl::NotFoundError(
        absl::StrCat("cuda:", ordinal, ": ", count, " CUDA device(s) visible to this process"));
  }
  const auto fail = [&](cudaError_t e, const char* what) {
    return absl::UnavailableError(
        absl::StrCat("cuda:", ordinal, ": ", what, ": ", cudaGetErrorString(e)));
  };
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) return fail(e, "cudaSetDevice");
  auto handles = std::make_unique<Handles>();
  if (cudaError_t e = cudaStreamCreateWithFlags(&handles->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return fail(e, "stream");
  }
  for (cudaEvent_t* event :
       {&handles->launched, &handles->computed, &handles->started, &handles->finished}) {
    if (cudaError_t e = cudaEventCreate(event); e != cudaSuccess) return fail(e, "event");
  }
  if (cudaError_t e = PrepareAttentionKernels(); e != cudaSuccess) {
    return fail(e, "preparing the attention kernels");
  }
  std::unique_ptr<CudaRuntime> runtime(new CudaRuntime(ordinal, options, std::move(handles)));
  cudaDeviceProp p{};
  if (cudaError_t e = cudaGetDeviceProperties(&p, ordinal); e != cudaSuccess) {
    return fail(e, "properties");
  }
  int clock_khz = 0, memory_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, ordinal);
  cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, ordinal);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, ordinal);
  gpu::DeviceProperties& d = runtime->properties_;
  d.name = p.name;
  d.ordinal = ordinal;
  d.sm_count = p.multiProcessorCount;
  d.compute_major = p.major;
  d.compute_minor = p.minor;
  d.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  d.driver = DriverVersion();
  d.bf16_tflops = d.sm_count * (clock_khz * 1e3) * Bf16FlopsPerSmClock(p.major) / 1e12;
  // Double data rate: two transfers a clock over the bus.
  d.hbm_tbps = 2.0 * (memory_khz * 1e3) * (bus_bits / 8.0) / 1e12;
  runtime->wgmma_attention_ =
      WgmmaAttentionRuns(p.major, p.minor) && kernels != AttentionKernels::kMma;
  if (runtime->wgmma_attention_) {
    if (cudaError_t e = PrepareWgmmaAttentionKernel(); e != cudaSuccess) {
      return fail(e, "preparing the warpgroup attention kernel");
    }
    if (cudaError_t e = PrepareExpandedAttentionKernel(); e != cudaSuccess) {
      return fail(e, "preparing the expanded-heads attention kernel");
    }
    // A driver without the tensor-map encoder keeps the plain warpgroup kernel.
    if (kernels == AttentionKernels::kBest) {
      void* encode = nullptr;
      if (cudaError_t e = PrepareSeesawAttentionKernel(&encode); e == cudaSuccess) {
        runtime->encode_tensor_map_ = encode;
      } else if (e != cudaErrorNotSupported) {
        return fail(e, "preparing the seesaw attention kernel");
      }
      cudaGetLastError();
    }
  }
  // What the kernels attain (gpu_runtime.h); with these B_theta is 56 on the H200, where the
  // bench's break-even lies between 32 and 64 queries.
  const double absorb_share = runtime->encode_tensor_map_ != nullptr ? gpu::kSeesawAbsorbShare
                              : runtime->wgmma_attention_            ? gpu::kWgmmaAbsorbShare
                                                                     : gpu::kMmaAbsorbShare;
  d.absorb_tflops = d.bf16_tflops * absorb_share;
  d.naive_tflops =
      d.bf16_tflops * (runtime->wgmma_attention_ ? gpu::kExpandedNaiveShare : gpu::kMmaNaiveShare);
  d.dense_unit_rows = runtime->wgmma_attention_ ? 2 * gpu::kAttentionTileRows : 0;
  return runtime;
}

CudaRuntime::CudaRuntime(int ordinal, CudaOptions options, std::unique_ptr<Handles> handles)
    : ordinal_(ordinal),
      options_(options),
      handles_(std::move(handles)),
      graphs_(options.graphs > 0 ? std::make_unique<LaunchGraphs>(options.graphs) : nullptr) {}

CudaRuntime::~CudaRuntime() {
  cudaSetDevice(ordinal_);
  graphs_.reset();
  for (cudaEvent_t e :
       {handles_->launched, handles_->computed, handles_->started, handles_->finished}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (handles_->stream != nullptr) cudaStreamDestroy(handles_->stream);
}

absl::Status CudaRuntime::Check(int error, absl::string_view what) {
  const auto e = static_cast<cudaError_t>(error);
  if (e == cudaSuccess) return absl::OkStatus();
  if (Recoverable(e)) {
    cudaGetLastError();  // clear it: the context is fine
    const std::string message =
        absl::StrCat("cuda:", ordinal_, ": ", what, ": ", cudaGetErrorString(e));
    if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
    if (e == cudaErrorNotSupported) return absl::UnimplementedError(message);
    return absl::InternalError(message);
  }
  std::lock_guard lock(fault_mu_);
  fault_ = absl::UnavailableError(absl::StrCat("cuda:", ordinal_, " failed (", what, ": ",
                                               cudaGetErrorName(e), ", ", cudaGetErrorString(e),
                                               "); the device is out of service"));
  return fault_;
}

absl::Status CudaRuntime::health() const {
  std::lock_guard lock(fault_mu_);
  return fault_;
}

absl::StatusOr<gpu::MemoryInfo> CudaRuntime::Memory() {
  RETURN_IF_ERROR(health());
  cudaSetDevice(ordinal_);
  size_t free = 0, total = 0;
  RETURN_IF_ERROR(Check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"));
  return gpu::MemoryInfo{static_cast<int64_t>(free), static_cast<int64_t>(total)};
}

absl::StatusOr<gpu::DevicePtr> CudaRuntime::Allocate(int64_t bytes, absl::string_view what) {
  RETURN_IF_ERROR(health());
  cudaSetDevice(ordinal_);
  void* p = nullptr;
  if (absl::Status s = Check(cudaMalloc(&p, static_cast<size_t>(bytes)),
                             absl::StrCat("allocating ", bytes, " bytes for ", what));
      !s.ok()) {
    return s;
  }
  return reinterpret_cast<uintptr_t>(p);
}

void CudaRuntime::Free(gpu::DevicePtr ptr) {
  if (ptr == 0) return;
  cudaSetDevice(ordinal_);
  cudaFree(reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)));
}

absl::StatusOr<gpu::HostBuffer> CudaRuntime::AllocateHost(int64_t bytes) {
  RETURN_IF_ERROR(health());
  void* p = nullptr;
  RETURN_IF_ERROR(Check(
      cudaHostAlloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault),
      absl::StrCat("pinning ", bytes, " host bytes")));
  std::shared_ptr<void> owner(p, [](void* q) { cudaFreeHost(q); });
  return gpu::HostBuffer{static_cast<std::byte*>(p), bytes, std::move(owner)};
}

absl::StatusOr<std::shared_ptr<void>> CudaRuntime::MapHost(const void* data, int64_t bytes) {
  RETURN_IF_ERROR(health());
  if (!options_.map_host) {
    return absl::UnimplementedError(
        absl::StrCat("cuda:", ordinal_, ": MLASERVE_CUDA_MAP_HOST=off"));
  }
  if (data == nullptr || bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("mapping ", bytes, " host bytes"));
  }
  cudaSetDevice(ordinal_);
  void* host = const_cast<void*>(data);
  // A registration is the process's, not a device's: a second GPU of the pool finds the
  // memory registered by the first (portable, so mapped for it too) and leaves unregistering
  // to the first's handle, which a pool releases with the others.
  bool registered_here = true;
  if (cudaError_t e = cudaHostRegister(host, static_cast<size_t>(bytes),
                                       cudaHostRegisterMapped | cudaHostRegisterPortable);
      e == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();
    registered_here = false;
  } else if (e != cudaSuccess) {
    // A refusal (memory the driver cannot pin) leaves the context usable: the caller copies.
    cudaGetLastError();
    return absl::UnimplementedError(absl::StrCat("cuda:", ordinal_, ": cudaHostRegister of ", bytes,
                                                 " bytes: ", cudaGetErrorString(e)));
  }
  void* device = nullptr;
  if (cudaHostGetDevicePointer(&device, host, 0) != cudaSuccess || device != host) {
    cudaGetLastError();
    if (registered_here) cudaHostUnregister(host);
    cudaGetLastError();
    return absl::UnimplementedError(
        absl::StrCat("cuda:", ordinal_, ": mapped host memory has another address on the device"));
  }
  const int ordinal = ordinal_;
  return mapped_->Add(data, bytes, [host, ordinal, registered_here] {
    if (!registered_here) return;
    cudaSetDevice(ordinal);
    cudaHostUnregister(host);
    // Whatever it says (the runtime unloading at exit), it must not read as the next
    // launch's error, which would take the device out of service.
    cudaGetLastError();
  });
}

bool CudaRuntime::ReadsInPlace(const void* data, int64_t bytes) const {
  return mapped_->Contains(data, bytes);
}

absl::Status CudaRuntime::CopyToDevice(gpu::DevicePtr dst, const void* src, int64_t bytes) {
  RETURN_IF_ERROR(health());
  cudaSetDevice(ordinal_);
  return Check(cudaMemcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), src,
                          static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
               "copy to device");
}

absl::Status CudaRuntime::CopyToHost(void* dst, gpu::DevicePtr src, int64_t bytes) {
  RETURN_IF_ERROR(health());
  cudaSetDevice(ordinal_);
  return Check(cudaMemcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(src)),
                          static_cast<size_t>(bytes), cudaMemcpyDeviceToHost),
               "copy to host");
}

absl::StatusOr<gpu::ProgramTiming> CudaRuntime::Run(const gpu::Program& program,
                                                    const gpu::ProgramIo& io) {
  RETURN_IF_ERROR(health());
  cudaSetDevice(ordinal_);
  Handles& h = *handles_;
  RETURN_IF_ERROR(Check(cudaEventRecord(h.started, h.stream), "event"));
  if (program.upload_bytes > 0) {
    RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(reinterpret_cast<void*>(static_cast<uintptr_t>(program.upload_to)),
                              io.upload.data(), static_cast<size_t>(program.upload_bytes),
                              cudaMemcpyHostToDevice, h.stream),
              "upload"));
  }
  RETURN_IF_ERROR(Check(cudaEventRecord(h.launched, h.stream), "event"));
  for (const gpu::Launch& launch : program.launches) {
    switch (RouteOf(launch)) {
      case Route::kGemm:
        ++counts_.gemm;
        break;
      case Route::kGemv:
        ++counts_.gemv;
        break;
      case Route::kSeesaw:
        ++counts_.seesaw;
        break;
      case Route::kWgmma:
        ++counts_.wgmma;
        break;
      case Route::kExpanded:
        ++counts_.expanded;
        break;
      case Route::kNarrow:
        ++counts_.narrow;
        break;
      case Route::kMma:
        ++counts_.mma;
        break;
      default:
        break;
    }
  }
  RETURN_IF_ERROR(graphs_ != nullptr ? EnqueueThroughGraphs(program.launches)
                                     : EnqueueLaunches(program.launches));
  RETURN_IF_ERROR(Check(cudaEventRecord(h.computed, h.stream), "event"));
  if (program.download_bytes > 0) {
    RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(
                  io.download.data(),
                  reinterpret_cast<const void*>(static_cast<uintptr_t>(program.download_from)),
                  static_cast<size_t>(program.download_bytes), cudaMemcpyDeviceToHost, h.stream),
              "download"));
  }
  RETURN_IF_ERROR(Check(cudaEventRecord(h.finished, h.stream), "event"));
  RETURN_IF_ERROR(Check(cudaStreamSynchronize(h.stream), "running the program"));
  gpu::ProgramTiming timing;
  float ms = 0;
  cudaEventElapsedTime(&ms, h.started, h.launched);
  timing.upload_ms = ms;
  cudaEventElapsedTime(&ms, h.launched, h.computed);
  timing.kernels_ms = ms;
  cudaEventElapsedTime(&ms, h.computed, h.finished);
  timing.download_ms = ms;
  return timing;
}

CudaRuntime::Route CudaRuntime::RouteOf(const gpu::Launch& launch) const {
  switch (launch.kind) {
    case gpu::LaunchKind::kCopyRows:
      return Route::kCopyRows;
    case gpu::LaunchKind::kFill:
      return Route::kFill;
    case gpu::LaunchKind::kGemm:
      return options_.row_kernel && launch.gemv_rows > 0 ? Route::kGemv : Route::kGemm;
    case gpu::LaunchKind::kAttention: {
      const bool latent_bf16 =
          launch.keys == gpu::KeysKind::kPagedBf16 && launch.dk == 576 && launch.dv == 512;
      // Tensor-map coordinates are 32-bit.
      const bool whole_blocks =
          launch.key_pool_rows > 0 && launch.key_pool_rows <= std::numeric_limits<int32_t>::max();
      // The bf16 cache's few rows stay on the seesaw kernel, whose bulk tensor copies outrun
      // the narrow shape's cp.async (docs/performance.md 21); mma.sync's own family takes them.
      if (options_.narrow && NarrowAttentionTakes(launch) &&
          (launch.keys == gpu::KeysKind::kPagedFp8 ||
           options_.attention == AttentionKernels::kMma)) {
        return Route::kNarrow;
      }
      if (latent_bf16 && whole_blocks && encode_tensor_map_ != nullptr) return Route::kSeesaw;
      if (latent_bf16 && wgmma_attention_) return Route::kWgmma;
      const bool expanded =
          launch.keys == gpu::KeysKind::kDense && launch.dk == 192 && launch.dv == 128;
      if (expanded && wgmma_attention_) return Route::kExpanded;
      return Route::kMma;
    }
    case gpu::LaunchKind::kCombine:
      return Route::kCombine;
  }
  return Route::kMma;
}

absl::Status CudaRuntime::EnqueueLaunches(std::span<const gpu::Launch> launches) {
  cudaStream_t stream = handles_->stream;
  for (const gpu::Launch& launch : launches) {
    cudaError_t e = cudaSuccess;
    switch (RouteOf(launch)) {
      case Route::kCopyRows:
        e = EnqueueCopyRows(launch, stream);
        break;
      case Route::kFill:
        e = EnqueueFill(launch, stream);
        break;
      case Route::kGemm:
        e = EnqueueGemm(launch, stream);
        break;
      case Route::kGemv:
        e = EnqueueGemv(launch, stream);
        break;
      case Route::kSeesaw:
        e = EnqueueSeesawAttention(launch, encode_tensor_map_, stream);
        break;
      case Route::kWgmma:
        e = EnqueueWgmmaAttention(launch, stream);
        break;
      case Route::kExpanded:
        e = EnqueueExpandedAttention(launch, stream);
        break;
      case Route::kNarrow:
        e = EnqueueAttention(launch, /*narrow=*/true, stream);
        break;
      case Route::kMma:
        e = EnqueueAttention(launch, /*narrow=*/false, stream);
        break;
      case Route::kCombine:
        e = EnqueueCombine(launch, stream);
        break;
    }
    if (e == cudaErrorNotSupported) {
      return absl::UnimplementedError(absl::StrFormat(
          "cuda:%d: no kernel for attention step '%s' (dk %d, dv %d, keys kind %d)", ordinal_,
          launch.name, launch.dk, launch.dv, static_cast<int>(launch.keys)));
    }
    RETURN_IF_ERROR(
        Check(e, absl::StrCat(gpu::LaunchKindName(launch.kind), " launch '", launch.name, "'")));
  }
  return absl::OkStatus();
}

absl::StatusOr<cudaGraphExec_t> CudaRuntime::Capture(std::span<const gpu::Launch> launches) {
  cudaStream_t stream = handles_->stream;
  // Thread-local: the pool's other GPUs (other threads) go on allocating meanwhile.
  RETURN_IF_ERROR(
      Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "graph capture"));
  const absl::Status enqueued = EnqueueLaunches(launches);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  const auto destroy = [&] {
    if (graph != nullptr) cudaGraphDestroy(graph);
  };
  if (!enqueued.ok()) {
    destroy();
    return enqueued;
  }
  if (absl::Status s = Check(ended, "graph capture"); !s.ok()) {
    destroy();
    return s;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  destroy();
  RETURN_IF_ERROR(Check(instantiated, "graph instantiation"));
  return exec;
}

absl::Status CudaRuntime::EnqueueThroughGraphs(std::span<const gpu::Launch> launches) {
  const std::string key = LaunchGraphs::Key(launches);
  if (cudaGraphExec_t exec = graphs_->Find(key); exec != nullptr) {
    ++counts_.graph_replays;
    return Check(cudaGraphLaunch(exec, handles_->stream), "graph launch");
  }
  if (!graphs_->Sighted(key)) return EnqueueLaunches(launches);
  absl::StatusOr<cudaGraphExec_t> exec = Capture(launches);
  if (!exec.ok()) {
    // A fault, or a launch without a kernel, is the program's answer; a capture the driver
    // would not make (an error that leaves the device usable) turns graphs off for good.
    if (!health().ok() || exec.status().code() == absl::StatusCode::kUnimplemented) {
      return exec.status();
    }
    graphs_.reset();
    graphs_off_ = exec.status();
    return EnqueueLaunches(launches);
  }
  graphs_->Insert(key, *exec);
  ++counts_.graphs_captured;
  ++counts_.graph_replays;
  return Check(cudaGraphLaunch(*exec, handles_->stream), "graph launch");
}

absl::Status CudaRuntime::InjectTrap() {
  RETURN_IF_ERROR(health());
  cudaSetDevice(ordinal_);
  RETURN_IF_ERROR(Check(EnqueueTrap(handles_->stream), "trap"));
  return Check(cudaStreamSynchronize(handles_->stream), "running the trap kernel");
}

}  // namespace mlaserve::cuda
