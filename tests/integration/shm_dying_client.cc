// A data-plane client that dies with a call in flight, for data_plane_test: it registers
// with the ticket it is given, publishes a latent call for the given sequences and exits
// 2 ms later without waiting for the answer (a process of its own: the test process runs
// gRPC's threads, across which a fork is not safe).
//
//   shm_dying_client SOCKET TICKET_HEX INSTANCE LAYER HEADS ID...

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "client/dataplane/shm_channel.h"
#include "kernels/core/bfloat16.h"

int main(int argc, char** argv) {
  if (argc < 7) return 2;
  mlaserve::v1::OpenDataPlaneResponse opened;
  opened.mutable_plane()->set_kind("shm");
  opened.mutable_plane()->set_address(argv[1]);
  opened.set_ticket(absl::HexStringToBytes(argv[2]));
  opened.set_instance_id(argv[3]);
  mlaserve::client::ShmChannelOptions options;
  options.region_bytes = 64 << 20;
  auto channel = mlaserve::client::ShmChannel::Open(opened, options);
  if (!channel.ok()) return 1;
  mlaserve::client::DecodeBatchRequest request;
  request.layer = std::atoi(argv[4]);
  const int64_t heads = std::atoi(argv[5]);
  for (int i = 6; i < argc; ++i) request.sequence_ids.push_back(argv[i]);
  const int64_t b = request.sequences();
  std::vector<mlaserve::Bf16> q(static_cast<size_t>(b * heads * 576),
                                mlaserve::Bf16::FromFloat(0.5f));
  request.latent = {mlaserve::v1::DTYPE_BF16, {b, 1, heads, 576}, q.data()};
  static mlaserve::client::DecodeBatchBuffers buffers(request, 512);
  std::thread call(
      [&] { (*channel)->Decode(request, buffers.output, absl::Seconds(30)).IgnoreError(); });
  call.detach();
  absl::SleepFor(absl::Milliseconds(2));
  _exit(0);
}
