#include "server/dataplane/shm_connection.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "mlaserve/v1/data_plane.pb.h"
#include "server/service/tensor_codec.h"

namespace mlaserve::dataplane {
namespace {

// A call descriptor is ids and shapes; its tensors lie elsewhere in the region.
constexpr uint64_t kMaxCallBytes = uint64_t{1} << 20;

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// Tensors named by region_offset, each copied out of the region before anything reads it,
// into the slot's arena; but queries the devices read in place (`in_place`) are left there,
// where they are 64-byte aligned (as the arena's copies are) for the devices' vector reads.
class RegionBytes final : public service::TensorBytes {
 public:
  RegionBytes(const MappedRegion& region, SlotArena& arena, bool in_place)
      : region_(region), arena_(arena), in_place_(in_place) {
    arena_.Reset();
  }

  absl::StatusOr<absl::string_view> Bytes(const v1::Tensor& tensor, absl::string_view field,
                                          uint64_t size, service::TensorUse use) override {
    if (!tensor.has_region_offset()) {
      return service::InlineTensorBytes().Bytes(tensor, field, size, use);
    }
    if (!tensor.data().empty()) {
      return Invalid(absl::StrCat(field, ".data"), "set beside region_offset; one or the other");
    }
    ASSIGN_OR_RETURN(const uint8_t* bytes, region_.Data(tensor.region_offset(), size,
                                                        absl::StrCat(field, ".region_offset")));
    if (in_place_ && use == service::TensorUse::kQueries && tensor.region_offset() % 64 == 0) {
      return absl::string_view(reinterpret_cast<const char*>(bytes), size);
    }
    char* copy = arena_.Take(size);
    if (size > 0) std::memcpy(copy, bytes, size);
    return absl::string_view(copy, size);
  }

 private:
  const MappedRegion& region_;
  SlotArena& arena_;
  const bool in_place_;
};

void SetStatus(const absl::Status& status, v1::RequestStatus* wire) {
  wire->set_code(static_cast<int>(status.code()));
  wire->set_message(std::string(status.message()));
}

void Wake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

char* SlotArena::Take(uint64_t size) {
  if (next_ == chunks_.size()) chunks_.push_back({nullptr, 0});
  Chunk& chunk = chunks_[next_++];
  if (chunk.size < size) {
    // 64-byte aligned (the views read bf16, the kernels like whole cache lines); a call of the
    // same shape next time finds it big enough.
    chunk.bytes.reset(static_cast<char*>(::operator new[](size, std::align_val_t{64})));
    chunk.size = size;
  }
  return chunk.bytes.get();
}

ShmConnection::ShmConnection(int fd, PeerCredentials peer, std::shared_ptr<ByteBudget> budget,
                             std::atomic<int64_t>& refused_doorbells)
    : fd_(fd), peer_(peer), budget_(std::move(budget)), refused_doorbells_(refused_doorbells) {}

ShmConnection::~ShmConnection() {
  if (region_ != nullptr) budget_->Give(tenant_, region_->bytes());
  close(fd_);
}

absl::Status ShmConnection::Register(UnixMessage hello, service::DataPlaneTickets& tickets,
                                     const std::string& instance_id,
                                     const DeviceMapper& map_for_devices) {
  int region_fd = hello.fd;
  absl::Status status = [&]() -> absl::Status {
    if (registered()) return absl::FailedPreconditionError("hello: this client is registered");
    v1::ShmHello message;
    if (!message.ParseFromString(hello.bytes)) {
      return Invalid("hello", absl::StrCat(hello.bytes.size(), " bytes that are not a ShmHello"));
    }
    if (message.version() != shm::kShmVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("version: the client speaks data-plane version ", message.version(),
                       "; this server speaks version ", shm::kShmVersion));
    }
    if (region_fd < 0) return Invalid("region", "no memfd came with the hello (SCM_RIGHTS)");
    ASSIGN_OR_RETURN(service::Tenant * tenant, tickets.Redeem(message.ticket()));
    const int fd = std::exchange(region_fd, -1);  // Map owns it from here
    ASSIGN_OR_RETURN(std::unique_ptr<MappedRegion> region,
                     MappedRegion::Map(fd, budget_->caps().item_bytes));
    RETURN_IF_ERROR(budget_->Take(tenant, region->bytes()));
    tenant_ = tenant;
    in_flight_.reset(new std::atomic<bool>[region->slot_count()]);
    for (uint32_t i = 0; i < region->slot_count(); ++i) in_flight_[i] = false;
    answer_areas_.resize(region->slot_count());
    arenas_.resize(region->slot_count());
    region_ = std::move(region);
    if (map_for_devices) device_mapping_ = map_for_devices(region_->base(), region_->bytes());
    return absl::OkStatus();
  }();
  if (region_fd >= 0) close(region_fd);
  v1::ShmWelcome welcome;
  SetStatus(status, welcome.mutable_status());
  welcome.set_version(shm::kShmVersion);
  welcome.set_instance_id(instance_id);
  SendUnixMessage(fd_, welcome.SerializeAsString());
  return status;
}

bool ShmConnection::Claim(uint32_t slot) {
  shm::Slot& s = region_->slot(slot);
  uint32_t expected = shm::kSubmitted;
  if (s.state.load(std::memory_order_relaxed) != expected ||
      !s.state.compare_exchange_strong(expected, shm::kTaken, std::memory_order_acq_rel)) {
    return false;
  }
  if (in_flight_[slot].exchange(true)) {
    // It answers the call it holds; the client's second doorbell for it gets nothing of its own.
    refused_doorbells_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  in_flight_count_.fetch_add(1, std::memory_order_relaxed);
  answer_areas_[slot] = {s.answer_offset.load(std::memory_order_relaxed),
                         s.answer_capacity.load(std::memory_order_relaxed)};
  return true;
}

absl::StatusOr<ShmConnection::TakenCall> ShmConnection::Take(uint32_t slot,
                                                             const engine::ModelConfig& model) {
  const shm::Slot& s = region_->slot(slot);
  const uint64_t call_offset = s.call_offset.load(std::memory_order_relaxed);
  const uint64_t call_bytes = s.call_bytes.load(std::memory_order_relaxed);
  if (call_bytes > kMaxCallBytes) {
    return Invalid("call_bytes", absl::StrCat(call_bytes, " exceed the ", kMaxCallBytes,
                                              " a call descriptor may take"));
  }
  ASSIGN_OR_RETURN(const uint8_t* at, region_->Data(call_offset, call_bytes, "call_offset"));
  v1::DataPlaneCall call;
  if (!call.ParseFromString(std::string(reinterpret_cast<const char*>(at), call_bytes))) {
    return Invalid("call", absl::StrCat(call_bytes, " bytes that are not a DataPlaneCall"));
  }
  if (!call.request().has_packed()) {
    return Invalid("request.packed", "missing; the shared-memory plane carries the packed form");
  }
  // The slot's arena holds the copies until its call ends (the slot runs one call at a time).
  RegionBytes source(*region_, arenas_[slot], queries_in_place());
  TakenCall taken;
  ASSIGN_OR_RETURN(taken.call, service::ParseDecodeRequest(call.request(), source));
  const engine::DecodeQuery& first = taken.call->queries.front();
  const uint64_t rows = static_cast<uint64_t>(taken.call->queries.size()) *
                        static_cast<uint64_t>(first.sq) *
                        static_cast<uint64_t>(engine::QueryHeads(first));
  const uint64_t width = first.space == engine::QuerySpace::kHead ? model.dv : model.dl;
  const uint64_t out_bytes = rows * width * DTypeSize(taken.call->output_dtype);
  const uint64_t lse_bytes = rows * sizeof(float);
  if (call.out_bytes() < out_bytes) {
    return Invalid("out_bytes", absl::StrCat(call.out_bytes(), "; the answers take ", out_bytes));
  }
  if (call.lse_bytes() < lse_bytes) {
    return Invalid("lse_bytes", absl::StrCat(call.lse_bytes(), "; the LSEs take ", lse_bytes));
  }
  ASSIGN_OR_RETURN(taken.out, region_->Data(call.out_offset(), out_bytes, "out_offset"));
  ASSIGN_OR_RETURN(taken.lse, region_->Data(call.lse_offset(), lse_bytes, "lse_offset"));
  taken.out_offset = call.out_offset();
  taken.lse_offset = call.lse_offset();
  if (call.timeout_us() > 0) {
    taken.deadline = absl::Now() + absl::Microseconds(static_cast<int64_t>(
                                       std::min<uint64_t>(call.timeout_us(), INT64_MAX / 2)));
  }
  return taken;
}

void ShmConnection::Answer(uint32_t slot, const absl::StatusOr<service::AnsweredDecode>& answered,
                           const TakenCall* taken,
                           absl::FunctionRef<void(const absl::Status&)> record) {
  v1::DataPlaneAnswer answer;
  absl::Status status = answered.status();
  if (answered.ok()) status = service::CheckAnswers(*answered);
  if (status.ok()) {
    const service::AnsweredDecode& a = *answered;
    service::EncodePackedOutputs(a, taken->out, taken->lse);
    const engine::DecodeQuery& first = a.call->queries.front();
    const int64_t sequences = static_cast<int64_t>(a.answers.size());
    v1::PackedResults& packed = *answer.mutable_response()->mutable_packed();
    v1::Tensor& out = *packed.mutable_out();
    out.set_dtype(a.call->output_dtype);
    for (const int64_t d : {sequences, int64_t{first.sq}, int64_t{engine::QueryHeads(first)},
                            a.OutElements(0) / (int64_t{first.sq} * engine::QueryHeads(first))}) {
      out.add_shape(d);
    }
    out.set_region_offset(taken->out_offset);
    v1::Tensor& lse = *packed.mutable_lse();
    lse.set_dtype(v1::DTYPE_FP32);
    for (const int64_t d : {sequences, int64_t{first.sq}, int64_t{engine::QueryHeads(first)}}) {
      lse.add_shape(d);
    }
    lse.set_region_offset(taken->lse_offset);
    for (const engine::DecodeAnswer& one : a.answers) {
      *packed.add_plans() = service::WirePlan(one.plan, a.tenant);
    }
  }
  SetStatus(status, answer.mutable_status());
  shm::Slot& s = region_->slot(slot);
  const AnswerArea area = answer_areas_[slot];
  uint64_t written = 0;
  size_t size = answer.ByteSizeLong();
  if (size > area.capacity) {
    const std::string needed =
        absl::StrCat("answer_capacity: ", area.capacity, " bytes; the answer takes ", size);
    answer.Clear();
    SetStatus(absl::ResourceExhaustedError(needed), answer.mutable_status());
    status = absl::ResourceExhaustedError(needed);
    size = answer.ByteSizeLong();
  }
  if (absl::StatusOr<uint8_t*> at = region_->Data(area.offset, size, "answer_offset");
      at.ok() && size <= area.capacity) {
    answer.SerializeWithCachedSizesToArray(*at);
    written = size;
  } else if (status.ok()) {
    status = absl::InvalidArgumentError("answer_offset: outside the region's data area");
  }
  record(status);
  s.answer_bytes.store(written, std::memory_order_relaxed);
  s.status_code.store(static_cast<int32_t>(status.code()), std::memory_order_relaxed);
  in_flight_[slot].store(false, std::memory_order_relaxed);
  in_flight_count_.fetch_sub(1, std::memory_order_relaxed);
  s.state.store(shm::kDone, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (s.client_waiting.load(std::memory_order_relaxed) != 0) Wake(s.state);
}

bool ShmConnection::Cancelled(uint32_t slot) const {
  return gone() || region_->slot(slot).cancel.load(std::memory_order_relaxed) != 0;
}

}  // namespace mlaserve::dataplane
