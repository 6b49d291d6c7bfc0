#include "kernels/gpu/open_gpu.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/gpu/fake_gpu_runtime.h"

namespace mlaserve::gpu {
namespace {

constexpr absl::string_view kCudaPrefix = "cuda:";
constexpr absl::string_view kFake = "fake-gpu";

}  // namespace

bool IsGpuName(absl::string_view name) {
  return name == kFake || absl::StartsWith(name, kCudaPrefix);
}

absl::StatusOr<std::unique_ptr<GpuRuntime>> OpenGpu(absl::string_view name) {
  if (name == kFake) return std::unique_ptr<GpuRuntime>(new FakeGpuRuntime());
  int ordinal = -1;
  if (!absl::StartsWith(name, kCudaPrefix) ||
      !absl::SimpleAtoi(name.substr(kCudaPrefix.size()), &ordinal) || ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a GPU name (cuda:N, N >= 0)"));
  }
  return OpenCudaGpu(ordinal);
}

std::string DescribeGpu(const DeviceProperties& p) {
  return absl::StrFormat("%s (cuda:%d, sm_%d%d, %d SMs, %.1f GiB, driver %s)", p.name, p.ordinal,
                         p.compute_major, p.compute_minor, p.sm_count,
                         static_cast<double>(p.total_memory) / (1 << 30), p.driver);
}

}  // namespace mlaserve::gpu
