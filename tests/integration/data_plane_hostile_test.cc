// What a hostile or broken client can do to the shared-memory plane, speaking its protocol
// by hand: a torn or foreign header, a region that can shrink, a spent ticket, offsets
// outside its region, a doorbell for a slot in flight. Each is refused naming what is wrong,
// and changes nothing for anyone.

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "common/shm_layout.h"
#include "common/unix_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mlaserve/v1/data_plane.pb.h"
#include "tests/integration/batch_scenario.h"
#include "tests/integration/data_plane_server.h"

namespace mlaserve::integration {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kBytes = 1 << 20;
constexpr uint32_t kSlots = 2;

// A region built by hand: a memfd of kBytes with a valid header unless a test spoils it.
class RawRegion {
 public:
  explicit RawRegion(bool seal = true) {
    fd_ = memfd_create("raw-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(ftruncate(fd_, kBytes), 0);
    if (seal) {
      EXPECT_EQ(fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    base_ =
        static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    std::memcpy(header().magic, shm::kShmMagic, 8);
    header().version = shm::kShmVersion;
    header().slot_count = kSlots;
    header().region_bytes = kBytes;
    header().slots_offset = shm::kSlotsOffset;
    header().data_offset = shm::DataOffset(kSlots);
  }
  ~RawRegion() {
    munmap(base_, kBytes);
    if (fd_ >= 0) close(fd_);
    if (socket_ >= 0) close(socket_);
  }
  shm::RegionHeader& header() { return *reinterpret_cast<shm::RegionHeader*>(base_); }
  shm::Slot& slot(uint32_t i) { return reinterpret_cast<shm::Slot*>(base_ + shm::kSlotsOffset)[i]; }
  uint8_t* at(uint64_t offset) { return base_ + offset; }

  // The hello with this region; the welcome's status.
  absl::Status Register(const v1::OpenDataPlaneResponse& opened, uint32_t version = 1) {
    absl::StatusOr<int> socket = ConnectUnix(opened.plane().address());
    if (!socket.ok()) return socket.status();
    socket_ = *socket;
    v1::ShmHello hello;
    hello.set_version(version);
    hello.set_ticket(opened.ticket());
    EXPECT_TRUE(SendUnixMessage(socket_, hello.SerializeAsString(), fd_));
    std::optional<UnixMessage> answer = ReceiveUnixMessage(socket_, 4096).message;
    v1::ShmWelcome welcome;
    if (!answer.has_value() || !welcome.ParseFromString(answer->bytes)) {
      return absl::UnavailableError("no welcome");
    }
    return absl::Status(static_cast<absl::StatusCode>(welcome.status().code()),
                        welcome.status().message());
  }

  // Publishes `call` in slot 0 (descriptor at the data area's start, answer after it), rings
  // and waits for the answer's status.
  absl::Status Call(const v1::DataPlaneCall& call, uint64_t call_offset = 0) {
    const uint64_t data = shm::DataOffset(kSlots);
    const std::string bytes = call.SerializeAsString();
    std::memcpy(at(data), bytes.data(), bytes.size());
    shm::Slot& s = slot(0);
    s.call_offset = call_offset != 0 ? call_offset : data;
    s.call_bytes = static_cast<uint32_t>(bytes.size());
    s.answer_offset = data + 64 * 1024;
    s.answer_capacity = 64 * 1024;
    s.state.store(shm::kSubmitted);
    SendUnixMessage(socket_, "ring");
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (s.state.load() != shm::kDone && absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(100));
    }
    if (s.state.load() != shm::kDone) return absl::DeadlineExceededError("no answer");
    v1::DataPlaneAnswer answer;
    s.state.store(shm::kIdle);
    if (s.answer_bytes.load() == 0) {
      return absl::Status(static_cast<absl::StatusCode>(s.status_code.load()), "no answer bytes");
    }
    EXPECT_TRUE(answer.ParseFromArray(at(s.answer_offset), static_cast<int>(s.answer_bytes)));
    return absl::Status(static_cast<absl::StatusCode>(answer.status().code()),
                        answer.status().message());
  }

  int fd_ = -1;
  int socket_ = -1;

 private:
  uint8_t* base_ = nullptr;
};

class DataPlaneHostileTest : public ::testing::Test {
 protected:
  v1::OpenDataPlaneResponse Ticket() {
    absl::StatusOr<v1::OpenDataPlaneResponse> opened = server_.client().OpenDataPlane("shm", 1);
    EXPECT_TRUE(opened.ok()) << opened.status();
    return *opened;
  }
  // A valid latent call for `sequences` whose one query's bytes lie at `q_offset`.
  v1::DataPlaneCall LatentCall(const std::vector<std::string>& ids, uint64_t q_offset) {
    v1::DataPlaneCall call;
    v1::PackedQueries& packed = *call.mutable_request()->mutable_packed();
    for (const std::string& id : ids) packed.add_sequence_ids(id);
    packed.set_layer(1);
    v1::Tensor& latent = *packed.mutable_latent();
    latent.set_dtype(v1::DTYPE_BF16);
    for (const int64_t d : {static_cast<int64_t>(ids.size()), int64_t{1},
                            int64_t{server_.model().heads}, int64_t{576}}) {
      latent.add_shape(d);
    }
    latent.set_region_offset(q_offset);
    const uint64_t rows = ids.size() * static_cast<uint64_t>(server_.model().heads);
    call.set_out_offset(q_offset + 2 * rows * 576);
    call.set_out_bytes(2 * rows * 512);
    call.set_lse_offset(call.out_offset() + call.out_bytes());
    call.set_lse_bytes(4 * rows);
    return call;
  }

  IntegrationServer server_{SmallEngineOptions(TinyModel()), "", WithDataPlane()};
};

TEST_F(DataPlaneHostileTest, ARegionThatIsNotRightIsRefusedNamingWhy) {
  RawRegion unsealed(/*seal=*/false);
  EXPECT_THAT(std::string(unsealed.Register(Ticket()).message()), HasSubstr("F_SEAL_SHRINK"));
  RawRegion foreign;
  std::memcpy(foreign.header().magic, "NOTMINE!", 8);
  EXPECT_THAT(std::string(foreign.Register(Ticket()).message()), HasSubstr("magic"));
  RawRegion newer;
  newer.header().version = 9;
  const absl::Status version = newer.Register(Ticket());
  EXPECT_EQ(version.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(version.message(), "region: layout version 9; this server speaks version 1");
  RawRegion torn;
  torn.header().slot_count = 7;  // slots and data no longer where the header says
  EXPECT_THAT(std::string(torn.Register(Ticket()).message()), StartsWith("region: header says"));
  RawRegion old_client;
  EXPECT_THAT(std::string(old_client.Register(Ticket(), /*version=*/2).message()),
              HasSubstr("the client speaks data-plane version 2"));
  // A ticket serves once.
  const v1::OpenDataPlaneResponse ticket = Ticket();
  RawRegion first, second;
  EXPECT_TRUE(first.Register(ticket).ok());
  const absl::Status spent = second.Register(ticket);
  EXPECT_EQ(spent.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(server_.server().shm_plane()->clients(), 1);
}

TEST_F(DataPlaneHostileTest, OffsetsOutsideTheRegionAreRefusedAndTheClientServedOn) {
  Rng rng(std::random_device{}());
  BatchScenario scenario(server_.client(), server_.model(), "raw", 1, engine::QuerySpace::kLatent,
                         1, 0, rng);
  RawRegion region;
  ASSERT_TRUE(region.Register(Ticket()).ok());
  const uint64_t q = shm::DataOffset(kSlots) + 128 * 1024;
  const std::vector<std::string> ids = scenario.request().sequence_ids;
  std::memset(region.at(q), 0, 2 * 16 * 576);
  EXPECT_TRUE(region.Call(LatentCall(ids, q)).ok());

  v1::DataPlaneCall call = LatentCall(ids, kBytes - 100);  // runs past the region's end
  EXPECT_THAT(std::string(region.Call(call).message()),
              StartsWith("packed.latent.region_offset: ["));
  call = LatentCall(ids, 64);  // inside the header and slots: not the data area
  EXPECT_THAT(std::string(region.Call(call).message()),
              HasSubstr("outside the region's data area"));
  call = LatentCall(ids, q);
  call.set_out_offset(kBytes - 8);
  EXPECT_THAT(std::string(region.Call(call).message()), StartsWith("out_offset: ["));
  call = LatentCall(ids, q);
  call.set_out_bytes(16);
  EXPECT_THAT(std::string(region.Call(call).message()), StartsWith("out_bytes: 16; the answers"));
  call = LatentCall(ids, q);
  call.mutable_request()->mutable_packed()->mutable_latent()->set_data("x");
  EXPECT_THAT(std::string(region.Call(call).message()), HasSubstr("set beside region_offset"));
  call = LatentCall(ids, q);
  call.mutable_request()->clear_packed();
  call.mutable_request()->add_queries();
  EXPECT_THAT(std::string(region.Call(call).message()), StartsWith("request.packed: missing"));
  EXPECT_THAT(std::string(region.Call(call, /*call_offset=*/kBytes - 4).message()),
              StartsWith("call_offset: ["));
  // Garbage where the descriptor should be.
  std::memset(region.at(shm::DataOffset(kSlots) + 512 * 1024), 0xff, 64);
  EXPECT_THAT(
      std::string(region.Call(LatentCall(ids, q), shm::DataOffset(kSlots) + 512 * 1024).message()),
      HasSubstr("not a DataPlaneCall"));
  // The client still gets answers, and so does everyone else.
  EXPECT_TRUE(region.Call(LatentCall(ids, q)).ok());
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  EXPECT_TRUE(server_.client().DecodeBatch(scenario.request(), buffers.output).ok());
}

}  // namespace
}  // namespace mlaserve::integration
