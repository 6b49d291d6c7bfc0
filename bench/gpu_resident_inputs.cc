#include "bench/gpu_resident_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/status_macros.h"
#include "kernels/mla/batch_step_builder.h"

namespace mlaserve::bench {

ResidentInputs::~ResidentInputs() {
  for (const auto& [host, copy] : copies_) runtime_.Free(copy.first);
  for (const auto& [name, at] : named_) runtime_.Free(at);
}

absl::Status ResidentInputs::Add(const void* host, int64_t bytes) {
  ASSIGN_OR_RETURN(const gpu::DevicePtr at, runtime_.Allocate(bytes, "bench input"));
  copies_[static_cast<const std::byte*>(host)] = {at, bytes};
  return runtime_.CopyToDevice(at, host, bytes);
}

absl::Status ResidentInputs::AddRepeated(const void* name, int64_t bytes,
                                         std::span<const std::byte> pattern) {
  ASSIGN_OR_RETURN(const gpu::DevicePtr at, runtime_.Allocate(bytes, "bench input"));
  named_[static_cast<const std::byte*>(name)] = at;
  const auto size = static_cast<int64_t>(pattern.size());
  for (int64_t done = 0; done < bytes; done += size) {
    RETURN_IF_ERROR(runtime_.CopyToDevice(at + done, pattern.data(), std::min(size, bytes - done)));
  }
  return absl::OkStatus();
}

gpu::InputResolver ResidentInputs::resolver() const {
  return [this](const StepBuffer& b) -> absl::StatusOr<gpu::DevicePtr> {
    const auto* p = static_cast<const std::byte*>(b.input);
    if (auto named = named_.find(p); named != named_.end()) return named->second;
    auto it = copies_.upper_bound(p);
    if (it != copies_.begin()) {
      --it;
      if (p + b.elements * ElementBytes(b.type) <= it->first + it->second.second) {
        return it->second.first + static_cast<gpu::DevicePtr>(p - it->first);
      }
    }
    return absl::NotFoundError("not copied to the device");
  };
}

absl::Status AddTyphoonInputs(ResidentInputs& inputs, const HostData& host) {
  const auto add = [&](std::span<const Bf16> values) {
    return inputs.Add(values.data(), static_cast<int64_t>(values.size_bytes()));
  };
  RETURN_IF_ERROR(add(host.pool));
  RETURN_IF_ERROR(add(host.weights->KvBProj(0)));
  RETURN_IF_ERROR(add(host.level->keys()));
  return add(host.level->values());
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? std::numeric_limits<double>::quiet_NaN() : values[values.size() / 2];
}

double GpuTimed::MedianUs() const { return Median(us); }

namespace {

void AppendAsFloat(const BatchBuffers& buffers, BufferRef ref, ElementType type, int64_t count,
                   std::vector<float>& to) {
  if (type == ElementType::kBf16) {
    for (const Bf16 v : buffers.Elements<Bf16>(ref, count)) to.push_back(v.ToFloat());
  } else {
    const std::span<const float> values = buffers.Elements<float>(ref, count);
    to.insert(to.end(), values.begin(), values.end());
  }
}

}  // namespace

absl::StatusOr<GpuTimed> TimeOnGpu(gpu::GpuBatchExecutor& executor,
                                   const gpu::DeviceProperties& props, DecodeBatch batch,
                                   const ResidentInputs& inputs, int repeats, int warmup) {
  gpu::UseGpuSplit(batch, props);
  ASSIGN_OR_RETURN(BuiltBatch built, BuildBatchSteps(batch));
  GpuTimed t;
  for (int r = 0; r < warmup + repeats; ++r) {
    ASSIGN_OR_RETURN(gpu::GpuBatchExecutor::Result run,
                     executor.Run(built.steps, inputs.resolver()));
    if (r >= warmup) t.us.push_back(run.timing.kernels_ms * 1e3);
    t.launches = run.launches;
    if (r + 1 < warmup + repeats) continue;
    for (const std::vector<AnswerRef>& group : built.answers) {
      for (const AnswerRef& a : group) {
        AppendAsFloat(*run.buffers, a.out, a.out_type, a.out_elements, t.out);
      }
    }
    for (const std::vector<AnswerRef>& group : built.answers) {
      for (const AnswerRef& a : group) {
        if (a.lse_elements > 0) {
          AppendAsFloat(*run.buffers, a.lse, ElementType::kFp32, a.lse_elements, t.lse);
        }
      }
    }
  }
  return t;
}

double RelativeRms(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size() || a.empty()) return std::numeric_limits<double>::quiet_NaN();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    den += double{b[i]} * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

}  // namespace mlaserve::bench
