// The same-host data plane as a hostile client drives it: the input is the whole region a
// client registers (header, slots, calls and tensors, all the client's to write), handed to
// the server's side as a sealed memfd. The region is mapped and checked, every slot whose
// state says "submitted" is claimed and taken (offsets, the call descriptor, copies of its
// tensors), calls that pass run through the fuzz engine's dispatcher, and each slot is
// answered into the region. Nothing may crash, leak or read outside the region.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>

#include "mlaserve/v1/data_plane.pb.h"
#include "server/dataplane/shm_connection.h"
#include "tests/fuzz/fuzz_engine.h"

namespace {

using mlaserve::dataplane::ByteBudget;
using mlaserve::dataplane::ShmConnection;

// The smallest region that holds a header and a slot, and room for a call.
constexpr size_t kMinimumBytes = 4096;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mlaserve::fuzz::FuzzEngine& fixture = mlaserve::fuzz::FuzzEngine::Get();
  const int memfd = memfd_create("fuzz-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  const size_t bytes = std::max(size, kMinimumBytes);
  if (memfd < 0 || ftruncate(memfd, static_cast<off_t>(bytes)) != 0 ||
      pwrite(memfd, data, size, 0) != static_cast<ssize_t>(size) ||
      fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    return 0;
  }
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0) {
    close(memfd);
    return 0;
  }
  static const auto budget = std::make_shared<ByteBudget>(mlaserve::dataplane::kDefaultRegionCaps,
                                                          mlaserve::dataplane::kRegionWording);
  static std::atomic<int64_t> refused{0};
  static mlaserve::service::DataPlaneTickets tickets;
  bool appended = false;
  {
    ShmConnection connection(sockets[0], {}, budget, refused);
    mlaserve::v1::ShmHello hello;
    hello.set_version(1);
    hello.set_ticket(tickets.Issue(nullptr));
    // Half the inputs as a GPU pool sees them: queries left in the region, read in place.
    const auto in_place = [size](const void*, uint64_t) -> std::shared_ptr<void> {
      return size % 2 == 1 ? std::make_shared<int>(0) : nullptr;
    };
    if (connection.Register({hello.SerializeAsString(), memfd}, tickets, "fuzz", in_place).ok()) {
      const mlaserve::engine::ModelConfig& model = fixture.engine().Info().model;
      for (uint32_t slot = 0; slot < connection.region().slot_count(); ++slot) {
        if (!connection.Claim(slot)) continue;
        absl::StatusOr<ShmConnection::TakenCall> taken = connection.Take(slot, model);
        const auto record = [](const absl::Status&) {};
        if (!taken.ok()) {
          connection.Answer(slot, taken.status(), nullptr, record);
          continue;
        }
        for (const auto& query : taken->call->queries) appended |= !query.append_rows.empty();
        std::promise<void> answered;
        auto call = std::move(taken->call);
        fixture.dispatcher().Dispatch(
            std::move(call), nullptr, absl::Now() + absl::Seconds(30), [] { return false; },
            [&](absl::StatusOr<mlaserve::service::AnsweredDecode> answer) {
              connection.Answer(slot, answer, &*taken, record);
              answered.set_value();
            });
        answered.get_future().get();
      }
    }
  }  // the connection closes its socket and unmaps the region
  close(sockets[1]);
  if (appended) fixture.Reset();
  return 0;
}
