#include "client/dataplane/shm_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/unix_socket.h"

namespace mlaserve::client {
namespace {

constexpr uint64_t kAlign = 64;
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);
// Most a sleeping caller waits before it looks whether the server is still there.
constexpr absl::Duration kLiveCheck = absl::Milliseconds(50);

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("data plane: ", what, ": ", std::strerror(errno)));
}

// Sleeps while `word` holds `expected`, at most `timeout`.
void FutexWait(std::atomic<uint32_t>& word, uint32_t expected, absl::Duration timeout) {
  const timespec relative = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &relative, nullptr,
          0);
}

bool PeerGone(int socket) {
  pollfd fd{socket, POLLIN | POLLRDHUP, 0};
  return poll(&fd, 1, 0) > 0 && (fd.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

// A call's places in its slot's share of the region, 64-byte aligned.
class SlotLayout {
 public:
  SlotLayout(uint64_t start, uint64_t end) : next_(start), end_(end) {}
  uint64_t Take(uint64_t bytes) {
    const uint64_t at = AlignUp(next_);
    next_ = at + bytes;
    return at;
  }
  bool fits() const { return next_ <= end_; }
  uint64_t used(uint64_t start) const { return next_ - start; }

 private:
  uint64_t next_;
  const uint64_t end_;
};

uint64_t AnswerBytes(const v1::Tensor& tensor) {
  uint64_t bytes = tensor.dtype() == v1::DTYPE_FP32 ? 4 : 2;
  for (const int64_t extent : tensor.shape()) bytes *= static_cast<uint64_t>(extent);
  return bytes;
}

uint64_t AnswerCapacity(int64_t sequences) { return 4096 + 256 * static_cast<uint64_t>(sequences); }

// The data area's share of each slot: what the array area (at most half) leaves.
uint64_t SlotBytes(const ShmChannelOptions& options) {
  const uint64_t data = options.region_bytes - shm::DataOffset(options.slots);
  const uint64_t arrays = std::min(options.array_bytes, data / 2) / 4096 * 4096;
  return (data - arrays) / options.slots / kAlign * kAlign;
}

}  // namespace

std::optional<SharedArray> ShmChannel::AllocateArray(uint64_t bytes) {
  const std::optional<uint64_t> at = arrays_.Allocate(bytes);
  if (!at.has_value()) return std::nullopt;
  std::shared_ptr<void> owner(
      base_ + *at, [channel = shared_from_this(), at = *at](void*) { channel->arrays_.Free(at); });
  return SharedArray{std::span<std::byte>(reinterpret_cast<std::byte*>(base_ + *at), bytes),
                     std::move(owner)};
}

std::optional<uint64_t> ShmChannel::ArrayOffset(const void* data, uint64_t bytes) const {
  const auto* p = static_cast<const uint8_t*>(data);
  if (p < base_ + arrays_.begin() || p > base_ + arrays_.end() ||
      bytes > static_cast<uint64_t>(base_ + arrays_.end() - p)) {
    return std::nullopt;
  }
  return static_cast<uint64_t>(p - base_);
}

bool ShmChannel::Fits(const DecodeBatchRequest& request, const DecodeBatchOutput& output) const {
  uint64_t bytes = AnswerCapacity(request.sequences()) + 1024 + 16 * kAlign;
  if (!ArrayOffset(output.out.data(), output.out.size())) bytes += output.out.size();
  if (!ArrayOffset(output.lse.data(), output.lse.size_bytes())) bytes += output.lse.size_bytes();
  for (const BatchTensor* t :
       {&request.q_nope, &request.q_pe, &request.latent, &request.append_rows}) {
    if (!ArrayOffset(t->data, t->bytes())) bytes += t->bytes();
  }
  for (const std::string& id : request.sequence_ids) bytes += id.size() + 4;
  return bytes <= slot_bytes_;
}

absl::StatusOr<std::unique_ptr<ShmChannel>> ShmChannel::Open(
    const v1::OpenDataPlaneResponse& opened, ShmChannelOptions options) {
  if (options.slots < 1 || options.slots > shm::kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots: ", options.slots, " is outside [1, ", shm::kMaxSlots, "]"));
  }
  const uint64_t bytes = std::max(options.region_bytes, shm::DataOffset(options.slots) + 4096);
  const int memfd = memfd_create("mlaserve-data-plane", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0) return Errno("memfd_create");
  struct Closes {
    int fd;
    ~Closes() { close(fd); }
  } closes{memfd};
  if (ftruncate(memfd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Errno("sizing the region");
  }
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (mapped == MAP_FAILED) return Errno("mmap");
  auto* base = static_cast<uint8_t*>(mapped);
  auto* header = new (base) shm::RegionHeader{};
  std::memcpy(header->magic, shm::kShmMagic, sizeof(header->magic));
  header->version = shm::kShmVersion;
  header->slot_count = options.slots;
  header->region_bytes = bytes;
  header->slots_offset = shm::kSlotsOffset;
  header->data_offset = shm::DataOffset(options.slots);
  for (uint32_t i = 0; i < options.slots; ++i) {
    new (base + shm::kSlotsOffset + i * sizeof(shm::Slot)) shm::Slot{};
  }
  options.region_bytes = bytes;
  absl::StatusOr<int> socket = ConnectUnix(opened.plane().address());
  if (!socket.ok()) {
    munmap(base, bytes);
    return socket.status();
  }
  v1::ShmHello hello;
  hello.set_version(shm::kShmVersion);
  hello.set_ticket(opened.ticket());
  absl::Status status = absl::OkStatus();
  if (!SendUnixMessage(*socket, hello.SerializeAsString(), memfd)) {
    status = Errno("sending the hello");
  } else {
    pollfd fd{*socket, POLLIN, 0};
    v1::ShmWelcome welcome;
    std::optional<UnixMessage> answer;
    if (poll(&fd, 1, static_cast<int>(absl::ToInt64Milliseconds(kHandshakeTimeout))) > 0) {
      answer = ReceiveUnixMessage(*socket, 4096).message;
    }
    if (!answer.has_value() || !welcome.ParseFromString(answer->bytes)) {
      status = absl::UnavailableError("data plane: the server sent no welcome");
    } else if (welcome.status().code() != 0) {
      status = absl::Status(static_cast<absl::StatusCode>(welcome.status().code()),
                            welcome.status().message());
    }
    if (answer.has_value() && answer->fd >= 0) close(answer->fd);
  }
  if (!status.ok()) {
    close(*socket);
    munmap(base, bytes);
    return status;
  }
  return std::unique_ptr<ShmChannel>(new ShmChannel(*socket, base, options, opened.instance_id()));
}

ShmChannel::ShmChannel(int socket, uint8_t* base, ShmChannelOptions options,
                       std::string instance_id)
    : socket_(socket),
      base_(base),
      options_(options),
      instance_id_(std::move(instance_id)),
      slot_bytes_(SlotBytes(options)),
      arrays_(shm::DataOffset(options.slots) + options.slots * slot_bytes_, options.region_bytes) {
  for (uint32_t i = 0; i < options.slots; ++i) free_slots_.push_back(options.slots - 1 - i);
}

ShmChannel::~ShmChannel() {
  close(socket_);
  munmap(base_, options_.region_bytes);
}

bool ShmChannel::broken() const {
  std::lock_guard lock(mu_);
  return broken_;
}

void ShmChannel::MarkBroken() {
  std::lock_guard lock(mu_);
  broken_ = true;
  slot_freed_.notify_all();
}

absl::StatusOr<uint32_t> ShmChannel::AcquireSlot(absl::Time deadline) {
  std::unique_lock lock(mu_);
  while (free_slots_.empty() && !broken_) {
    if (slot_freed_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout) {
      return absl::DeadlineExceededError(
          absl::StrCat("data plane: every one of its ", options_.slots, " slots stayed busy"));
    }
  }
  if (broken_) return absl::UnavailableError("data plane: the server closed it");
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void ShmChannel::ReleaseSlot(uint32_t slot) {
  std::lock_guard lock(mu_);
  free_slots_.push_back(slot);
  slot_freed_.notify_one();
}

void ShmChannel::Ring(uint32_t slot) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header().server_sleeping.load(std::memory_order_relaxed) == 0) return;
  const std::string doorbell(reinterpret_cast<const char*>(&slot), sizeof(slot));
  SendUnixMessage(socket_, doorbell);  // a full socket already holds a doorbell for it
}

absl::Status ShmChannel::AwaitAnswer(uint32_t index, absl::Time deadline) {
  shm::Slot& s = slot(index);
  const absl::Time start = absl::Now();
  // Sleeping costs a wake-up (tens of microseconds) when the answer comes; spinning costs a
  // CPU. So the caller sleeps through most of what recent calls took, then spins around when
  // the answer is due, then sleeps again if it is late.
  const absl::Duration expected = absl::Nanoseconds(expected_ns_.load(std::memory_order_relaxed));
  const absl::Time spin_from = start + expected * 0.9 - options_.spin;
  const absl::Time spin_until = std::max(start, spin_from) + 2 * options_.spin + expected * 0.1;
  auto done = [&] { return s.state.load(std::memory_order_acquire) == shm::kDone; };
  auto sleep_until = [&](absl::Time until) {
    s.client_waiting.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t seen = s.state.load(std::memory_order_acquire);
    if (seen != shm::kDone) {
      FutexWait(s.state, seen, std::max(absl::ZeroDuration(), until - absl::Now()));
    }
    s.client_waiting.store(0, std::memory_order_relaxed);
  };
  while (!done() && absl::Now() < std::min(spin_from, deadline)) {
    sleep_until(std::min({spin_from, deadline, absl::Now() + kLiveCheck}));
  }
  while (!done() && absl::Now() < std::min(spin_until, deadline)) {
  }
  while (!done()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("data plane: no answer in time");
    sleep_until(std::min(deadline, now + kLiveCheck));
    if (!done() && PeerGone(socket_)) {
      return absl::UnavailableError(
          "data plane: the server closed it (it stopped or restarted); open it again");
    }
  }
  // What this call took, for the next one's guess (recent calls weigh most).
  const int64_t took = absl::ToInt64Nanoseconds(absl::Now() - start);
  const int64_t before = expected_ns_.load(std::memory_order_relaxed);
  expected_ns_.store(before == 0 ? took : (3 * before + took) / 4, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status ShmChannel::Decode(const DecodeBatchRequest& request, DecodeBatchOutput& output,
                                absl::Duration timeout) {
  if (absl::Status checked = CheckDecodeBatch(request); !checked.ok()) return checked;
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<uint32_t> acquired = AcquireSlot(deadline);
  if (!acquired.ok()) return acquired.status();
  const uint32_t index = *acquired;
  const uint64_t start = shm::DataOffset(options_.slots) + index * slot_bytes_;
  SlotLayout layout(start, start + slot_bytes_);
  v1::DataPlaneCall call;
  // Each tensor's bytes go to its place in the slot, named in the message by offset; one
  // already in the array area is named where it is.
  auto place = [&](const BatchTensor& tensor, int64_t, int64_t, v1::Tensor* wire) {
    if (const std::optional<uint64_t> in_array = ArrayOffset(tensor.data, tensor.bytes())) {
      wire->set_region_offset(*in_array);
      return;
    }
    const uint64_t at = layout.Take(tensor.bytes());
    if (layout.fits() && tensor.bytes() > 0) std::memcpy(base_ + at, tensor.data, tensor.bytes());
    wire->set_region_offset(at);
  };
  *call.mutable_request() = PackedDecodeRequest(request, 0, request.sequences(), place);
  // Answers written where the caller's buffers are when those are in the array area.
  const std::optional<uint64_t> out_in_array = ArrayOffset(output.out.data(), output.out.size());
  const std::optional<uint64_t> lse_in_array =
      ArrayOffset(output.lse.data(), output.lse.size_bytes());
  call.set_out_bytes(output.out.size());
  call.set_out_offset(out_in_array ? *out_in_array : layout.Take(output.out.size()));
  call.set_lse_bytes(output.lse.size_bytes());
  call.set_lse_offset(lse_in_array ? *lse_in_array : layout.Take(output.lse.size_bytes()));
  call.set_timeout_us(
      static_cast<uint64_t>(std::max<int64_t>(1, absl::ToInt64Microseconds(timeout))));
  const uint64_t answer_capacity = AnswerCapacity(request.sequences());
  const uint64_t answer_offset = layout.Take(answer_capacity);
  const std::string descriptor = call.SerializeAsString();
  const uint64_t call_offset = layout.Take(descriptor.size());
  if (!layout.fits()) {
    ReleaseSlot(index);
    return absl::FailedPreconditionError(
        absl::StrCat("data plane: the call takes ", layout.used(start), " bytes; a slot holds ",
                     slot_bytes_, " (raise region_bytes or lower slots)"));
  }
  std::memcpy(base_ + call_offset, descriptor.data(), descriptor.size());
  shm::Slot& s = slot(index);
  s.call_offset.store(call_offset, std::memory_order_relaxed);
  s.call_bytes.store(static_cast<uint32_t>(descriptor.size()), std::memory_order_relaxed);
  s.answer_offset.store(answer_offset, std::memory_order_relaxed);
  s.answer_capacity.store(answer_capacity, std::memory_order_relaxed);
  s.answer_bytes.store(0, std::memory_order_relaxed);
  s.cancel.store(0, std::memory_order_relaxed);
  s.state.store(shm::kSubmitted, std::memory_order_release);
  Ring(index);
  absl::Status waited = AwaitAnswer(index, deadline);
  if (absl::IsDeadlineExceeded(waited)) {
    // The server abandons it at its next look; the slot is reused once it says so.
    s.cancel.store(1, std::memory_order_relaxed);
    waited = AwaitAnswer(index, absl::Now() + absl::Seconds(1));
    if (waited.ok()) waited = absl::DeadlineExceededError("data plane: no answer in time");
  }
  if (absl::IsUnavailable(waited)) MarkBroken();
  if (!waited.ok()) {
    // A slot whose call may still run stays out of use; one answered is free again. So do
    // the caller's arrays the call would answer into: they are never handed out again.
    if (s.state.load(std::memory_order_acquire) == shm::kDone) {
      s.state.store(shm::kIdle, std::memory_order_relaxed);
      ReleaseSlot(index);
    } else {
      if (out_in_array) arrays_.Retire(*out_in_array, output.out.size());
      if (lse_in_array) arrays_.Retire(*lse_in_array, output.lse.size_bytes());
    }
    return waited;
  }
  const uint64_t answer_bytes = s.answer_bytes.load(std::memory_order_relaxed);
  const auto code = static_cast<absl::StatusCode>(s.status_code.load(std::memory_order_relaxed));
  v1::DataPlaneAnswer answer;
  absl::Status status = absl::OkStatus();
  if (answer_bytes == 0 || answer_bytes > answer_capacity ||
      !answer.ParseFromArray(base_ + answer_offset, static_cast<int>(answer_bytes))) {
    status = absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kInternal : code,
                          "data plane: the server wrote no readable answer");
  } else if (answer.status().code() != 0) {
    status = absl::Status(static_cast<absl::StatusCode>(answer.status().code()),
                          answer.status().message());
  } else if (const v1::Tensor& out = answer.response().packed().out();
             AnswerBytes(out) != output.out.size()) {
    status = absl::InvalidArgumentError(
        absl::StrCat("out: ", output.out.size(), " bytes; the answers take ", AnswerBytes(out)));
  } else {
    output.plans.assign(answer.response().packed().plans().begin(),
                        answer.response().packed().plans().end());
    if (!out_in_array) std::memcpy(output.out.data(), base_ + call.out_offset(), output.out.size());
    if (!lse_in_array) {
      std::memcpy(output.lse.data(), base_ + call.lse_offset(), output.lse.size_bytes());
    }
  }
  s.state.store(shm::kIdle, std::memory_order_relaxed);
  ReleaseSlot(index);
  return status;
}

}  // namespace mlaserve::client
