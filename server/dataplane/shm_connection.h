#ifndef MLASERVE_SERVER_DATAPLANE_SHM_CONNECTION_H_
#define MLASERVE_SERVER_DATAPLANE_SHM_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unix_socket.h"
#include "server/dataplane/byte_budget.h"
#include "server/dataplane/mapped_region.h"
#include "server/engine/model/model_config.h"
#include "server/service/data_plane_tickets.h"
#include "server/service/decode_answers.h"
#include "server/service/decode_codec.h"

namespace mlaserve::dataplane {

// Memory a slot's call copies its tensors into, kept from call to call: a framework's calls
// have the same shapes step after step, so after the first they allocate (and fault in)
// nothing.
class SlotArena {
 public:
  void Reset() { next_ = 0; }
  // `size` bytes, valid until the next Reset.
  char* Take(uint64_t size);

 private:
  struct AlignedDelete {
    void operator()(char* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  struct Chunk {
    std::unique_ptr<char[], AlignedDelete> bytes;
    uint64_t size = 0;
  };
  std::vector<Chunk> chunks_;
  size_t next_ = 0;
};

// One client of the shared-memory plane: its socket, its registered region and tenant, and
// which of its slots the server is running. Its region stays mapped while a call of it runs,
// even after the client has gone (the answer is then written to memory nobody reads).
// Maps a client's region into the devices for them to read its queries in place
// (engine::Engine::MapHostMemory): a handle that ends the mapping, or null where they do not.
using DeviceMapper = std::function<std::shared_ptr<void>(const void* data, uint64_t bytes)>;

class ShmConnection {
 public:
  // `refused_doorbells` counts doorbells for a slot already running a call (Claim).
  ShmConnection(int fd, PeerCredentials peer, std::shared_ptr<ByteBudget> budget,
                std::atomic<int64_t>& refused_doorbells);
  ~ShmConnection();  // closes the socket, gives the region's bytes back
  ShmConnection(const ShmConnection&) = delete;
  ShmConnection& operator=(const ShmConnection&) = delete;

  int fd() const { return fd_; }
  const PeerCredentials& peer() const { return peer_; }
  bool registered() const { return region_ != nullptr; }
  const MappedRegion& region() const { return *region_; }
  service::Tenant* tenant() const { return tenant_; }
  uint64_t registered_bytes() const { return registered() ? region_->bytes() : 0; }

  // The hello (a ShmHello with the region's memfd): the ticket spent, the region mapped and
  // counted, and mapped into the devices where `map_for_devices` (may be empty) does so.
  // Answers the client a ShmWelcome either way; on an error the caller closes.
  absl::Status Register(UnixMessage hello, service::DataPlaneTickets& tickets,
                        const std::string& instance_id, const DeviceMapper& map_for_devices);
  // Whether the devices read this client's queries from its region in place.
  bool queries_in_place() const { return device_mapping_ != nullptr; }

  // A call published in `slot`, copied out of the region and checked (what is checked is what
  // the engine reads: a client that rewrites its region meanwhile changes nothing here). The
  // exception: where the devices read the queries in place (queries_in_place()), the queries
  // stay in the region and the devices' own upload is their one copy; a client that rewrites
  // them mid-call can only change its own answers (the GPU's arithmetic, on whatever it
  // reads, decides nothing else; rows for the cache are copied as ever).
  struct TakenCall {
    std::unique_ptr<service::ParsedDecode> call;
    absl::Time deadline = absl::InfiniteFuture();
    uint8_t* out = nullptr;  // where the answers go, checked against their size
    uint8_t* lse = nullptr;
    uint64_t out_offset = 0;
    uint64_t lse_offset = 0;
  };
  // Claims `slot` if the client published a call there (false otherwise, or when the slot
  // is already running a call: a second doorbell for it is refused, and counted). Then the
  // call, or the status to answer it with.
  bool Claim(uint32_t slot);
  absl::StatusOr<TakenCall> Take(uint32_t slot, const engine::ModelConfig& model);

  // Writes the slot's answer (the answers, or `status`) and wakes the client; the slot is
  // free to run another call after. `record` sees the status the client gets, before it can.
  void Answer(uint32_t slot, const absl::StatusOr<service::AnsweredDecode>& answered,
              const TakenCall* taken, absl::FunctionRef<void(const absl::Status&)> record);

  // The client left (its socket closed): its calls in flight are cancelled.
  void MarkGone() { gone_.store(true, std::memory_order_relaxed); }
  bool gone() const { return gone_.load(std::memory_order_relaxed); }
  bool Cancelled(uint32_t slot) const;
  int calls_in_flight() const { return in_flight_count_.load(); }

 private:
  const int fd_;
  const PeerCredentials peer_;
  const std::shared_ptr<ByteBudget> budget_;
  std::unique_ptr<MappedRegion> region_;
  // Declared after region_: the devices let go of the memory before it is unmapped.
  std::shared_ptr<void> device_mapping_;
  service::Tenant* tenant_ = nullptr;
  std::unique_ptr<std::atomic<bool>[]> in_flight_;
  // Each slot's answer area, read once when its call is claimed.
  struct AnswerArea {
    uint64_t offset = 0;
    uint64_t capacity = 0;
  };
  std::vector<AnswerArea> answer_areas_;
  std::vector<SlotArena> arenas_;
  std::atomic<int> in_flight_count_{0};
  std::atomic<bool> gone_{false};
  std::atomic<int64_t>& refused_doorbells_;
};

}  // namespace mlaserve::dataplane

#endif  // MLASERVE_SERVER_DATAPLANE_SHM_CONNECTION_H_
