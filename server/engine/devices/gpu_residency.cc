#include "server/engine/devices/gpu_residency.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/gpu/expansion_lowering.h"

namespace mlaserve::engine {
namespace {

// An expansion's device memory, handed back through the queue when the store drops it.
struct DeviceExpansion {
  gpu::DevicePtr keys = 0;
  gpu::DevicePtr values = 0;
};

}  // namespace

GpuResidency::GpuResidency(std::shared_ptr<gpu::GpuRuntime> runtime,
                           std::shared_ptr<PageWriteLog> writes)
    : runtime_(std::move(runtime)), writes_(std::move(writes)) {}

GpuResidency::~GpuResidency() {
  FreeReleased();
  if (weights_.device != 0) runtime_->Free(weights_.device);
  if (pool_.device != 0) runtime_->Free(pool_.device);
}

absl::Status GpuResidency::Attach(const ModelWeights& weights, const PagedKvCache& pool) {
  const std::span<const std::byte> w = weights.all_bytes();
  ASSIGN_OR_RETURN(weights_.device,
                   runtime_->Allocate(static_cast<int64_t>(w.size()), "the model's weights"));
  weights_.host = w.data();
  weights_.bytes = static_cast<int64_t>(w.size());
  RETURN_IF_ERROR(runtime_->CopyToDevice(weights_.device, w.data(), weights_.bytes));
  page_bytes_ = int64_t{pool.page_size()} * pool.width() * static_cast<int64_t>(sizeof(Bf16));
  const int64_t pool_bytes = pool.num_pages() * page_bytes_;
  ASSIGN_OR_RETURN(pool_.device, runtime_->Allocate(pool_bytes, "the KV page pool"));
  pool_.host = reinterpret_cast<const std::byte*>(pool.pages.data());
  pool_.bytes = pool_bytes;
  return absl::OkStatus();
}

std::vector<gpu::UploadCopy> GpuResidency::TakeWrittenRows() {
  std::vector<gpu::UploadCopy> copies;
  for (const PageWriteLog::Range& r : writes_->Drain()) {
    const int64_t offset = int64_t{r.page} * page_bytes_ + r.begin;
    copies.push_back(
        {pool_.host + offset, pool_.device + static_cast<gpu::DevicePtr>(offset), r.end - r.begin});
  }
  return copies;
}

void GpuResidency::Unflush(const std::vector<gpu::UploadCopy>& copies) {
  std::vector<PageWriteLog::Range> ranges;
  for (const gpu::UploadCopy& c : copies) {
    const int64_t offset = c.src - pool_.host;
    ranges.push_back({static_cast<int32_t>(offset / page_bytes_), offset % page_bytes_,
                      offset % page_bytes_ + c.bytes});
  }
  writes_->Restore(ranges);
}

absl::Status GpuResidency::Flush() {
  std::vector<gpu::UploadCopy> copies = TakeWrittenRows();
  for (size_t i = 0; i < copies.size(); ++i) {
    if (absl::Status s = runtime_->CopyToDevice(copies[i].dst, copies[i].src, copies[i].bytes);
        !s.ok()) {
      Unflush(std::vector<gpu::UploadCopy>(copies.begin() + static_cast<int64_t>(i), copies.end()));
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<gpu::DevicePtr> GpuResidency::Resolve(const StepBuffer& b) const {
  const int64_t bytes = b.elements * ElementBytes(b.type);
  if (pool_.Holds(b.input, bytes)) return pool_.At(b.input);
  if (weights_.Holds(b.input, bytes)) return weights_.At(b.input);
  // An expansion's (or a head range of one) device address, as the store handed it out.
  const auto at = static_cast<gpu::DevicePtr>(reinterpret_cast<uintptr_t>(b.input));
  auto it = expansions_.upper_bound(at);
  if (it != expansions_.begin()) {
    --it;
    if (at >= it->first && at + static_cast<gpu::DevicePtr>(bytes) <=
                               it->first + static_cast<gpu::DevicePtr>(it->second)) {
      return at;
    }
  }
  return absl::NotFoundError("neither the pool, the weights nor an expansion on the device");
}

void GpuResidency::FreeReleased() {
  std::vector<gpu::DevicePtr> pointers;
  {
    std::lock_guard lock(released_->mu);
    pointers.swap(released_->pointers);
  }
  for (gpu::DevicePtr p : pointers) {
    auto it = expansions_.find(p);
    if (it != expansions_.end()) {
      expansion_bytes_ -= it->second;
      expansions_.erase(it);
    }
    runtime_->Free(p);
  }
}

absl::StatusOr<std::unique_ptr<ExpandedKvData>> GpuResidency::Build(const PagePool& pool,
                                                                    const Request& r,
                                                                    const ModelWeights& weights) {
  RETURN_IF_ERROR(runtime_->health());
  const ModelConfig& m = weights.config();
  const int tokens = r.end - r.begin;
  const int64_t key_bytes = int64_t{m.heads} * tokens * m.dqk() * 2;
  const int64_t value_bytes = int64_t{m.heads} * tokens * m.dv * 2;
  FreeReleased();
  ASSIGN_OR_RETURN(const gpu::DevicePtr keys, runtime_->Allocate(key_bytes, "expanded keys"));
  absl::StatusOr<gpu::DevicePtr> values = runtime_->Allocate(value_bytes, "expanded values");
  if (!values.ok()) {
    runtime_->Free(keys);
    return values.status();
  }
  auto release = [&](absl::Status s) {
    runtime_->Free(keys);
    runtime_->Free(*values);
    return s;
  };
  if (r.dtype == KvDtype::kFp8) {
    // FP8 prefixes expand on the host (each row dequantised first) and are copied up once.
    const ExpandedKvData host = ExpandedKvData::BuildFromFp8(pool.Fp8View(), r.pages, r.begin,
                                                             r.end, m.dr, weights.Layer(r.layer));
    if (absl::Status s = runtime_->CopyToDevice(keys, host.keys().data(), key_bytes); !s.ok())
      return release(s);
    if (absl::Status s = runtime_->CopyToDevice(*values, host.values().data(), value_bytes);
        !s.ok())
      return release(s);
  } else {
    if (absl::Status s = Flush(); !s.ok()) return release(s);
    gpu::ExpansionSpec spec;
    spec.pool = pool_.device;
    spec.page_stride = page_bytes_;
    spec.page_size = pool.page_size();
    spec.pages = r.pages;
    spec.begin = r.begin;
    spec.end = r.end;
    spec.kv_b = weights_.At(weights.KvBProj(r.layer).data());
    spec.heads = m.heads;
    spec.dn = m.dn;
    spec.dr = m.dr;
    spec.dl = m.dl;
    spec.dv = m.dv;
    spec.keys = keys;
    spec.values = *values;
    absl::StatusOr<gpu::Program> sized = gpu::LowerExpansion(spec, 0, {});
    if (!sized.ok()) return release(sized.status());
    absl::StatusOr<gpu::DevicePtr> records =
        runtime_->Allocate(sized->upload_bytes, "expansion records");
    if (!records.ok()) return release(records.status());
    std::vector<std::byte> upload(static_cast<size_t>(sized->upload_bytes));
    absl::StatusOr<gpu::Program> program = gpu::LowerExpansion(spec, *records, upload);
    absl::Status run = program.status();
    if (run.ok()) run = runtime_->Run(*program, {upload, {}}).status();
    runtime_->Free(*records);
    if (!run.ok()) return release(run);
  }
  expansions_[keys] = key_bytes;
  expansions_[*values] = value_bytes;
  expansion_bytes_ += key_bytes + value_bytes;
  std::shared_ptr<void> storage(new DeviceExpansion{keys, *values}, [queue = released_](void* p) {
    auto* e = static_cast<DeviceExpansion*>(p);
    {
      std::lock_guard lock(queue->mu);
      queue->pointers.push_back(e->keys);
      queue->pointers.push_back(e->values);
    }
    delete e;
  });
  const auto* k = reinterpret_cast<const Bf16*>(static_cast<uintptr_t>(keys));
  const auto* v = reinterpret_cast<const Bf16*>(static_cast<uintptr_t>(*values));
  return ExpandedKvData::OnDevice(m.heads, tokens, m.dqk(), m.dv, k, v, std::move(storage));
}

GpuResidency::Usage GpuResidency::usage() const {
  return Usage{weights_.bytes, pool_.bytes, expansion_bytes_.load()};
}

}  // namespace mlaserve::engine
