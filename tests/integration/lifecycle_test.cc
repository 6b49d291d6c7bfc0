// Health, metrics, deadlines, cancellation and drain of the real server.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/health_check.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "kernels/core/cpu_features.h"
#include "kernels/core/matmul.h"
#include "tests/integration/integration_server.h"
#include "tests/testing/scratch_dir.h"

namespace mlaserve::integration {
namespace {

using ::testing::HasSubstr;

// GET http://127.0.0.1:port/metrics, the way Prometheus scrapes.
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) body.append(buffer, n);
    }
  }
  close(fd);
  return body;
}

v1::DecodeQuery LatentOn(const std::string& id, const engine::ModelConfig& model, Rng& rng) {
  return client::LatentQuery(
      id, 0, 1,
      Tensor3(RandomBf16(static_cast<size_t>(model.heads) * model.dk_latent(), 1.0, rng), 1,
              model.heads, model.dk_latent()));
}

TEST(LifecycleTest, ServingHealthAndMetricsAfterWarmUp) {
  IntegrationServer server(SmallEngineOptions(TinyModel()), "127.0.0.1:0");
  auto channel = grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials());
  EXPECT_EQ(*client::CheckHealth(channel, ""), client::ServingStatus::kServing);
  Rng rng(std::random_device{}());
  ASSERT_TRUE(server.client().CreateSequence("s").ok());
  ASSERT_TRUE(
      server.client().AppendKv("s", 0, 0, Tensor2(RandomBf16(40 * 576, 1.0, rng), 40, 576)).ok());
  ASSERT_TRUE(server.client().Decode({LatentOn("s", server.model(), rng)}).ok());
  ASSERT_GT(server.server().metrics_port(), 0);
  const std::string metrics = Scrape(server.server().metrics_port());
  EXPECT_THAT(
      metrics,
      HasSubstr("mlaserve_requests_total{code=\"OK\",rpc=\"Decode\",transport=\"grpc\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("mlaserve_decode_queue_seconds_count"));
  EXPECT_THAT(metrics, HasSubstr("mlaserve_batch_queries_count"));
  EXPECT_THAT(metrics, HasSubstr("mlaserve_sequences 1"));
  EXPECT_THAT(metrics, HasSubstr("mlaserve_kv_pages{state=\"used\"} 2"));  // 40 rows, 32 a page
  EXPECT_THAT(metrics, HasSubstr("mlaserve_batch_groups_total{formulation=\"absorb\"}"));
  // The machine the numbers came from: its ISA and matrix backend, in /metrics and in
  // GetServerInfo, as detected at start.
  const CpuFeatures& cpu = HostCpu();
  EXPECT_THAT(metrics, HasSubstr(absl::StrCat("isa=\"", cpu.MatrixIsa(), "\"")));
  auto info = server.client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->host().isa(), cpu.MatrixIsa());
  EXPECT_EQ(info->host().cpu_model(), cpu.model);
  EXPECT_EQ(info->host().matrix_unit(), MatrixUnitBackend());
}

// A serving framework on the same host can reach the server over a Unix-domain socket
// (`--listen=unix:/path`), which skips the TCP stack; the socket and its directory are gone
// afterwards.
TEST(LifecycleTest, ServesDecodeOverAUnixDomainSocket) {
  std::filesystem::path dir;
  {
    // Removed however the test ends, a failed assertion included.
    const testing::ScratchDir scratch("mlaserve-uds");
    const std::string socket = scratch.Path("mlaserve.sock");
    dir = std::filesystem::path(socket).parent_path();
    const std::string address = absl::StrCat("unix:", socket);
    service::ServerOptions server_options;
    server_options.listen_address = address;
    server_options.metrics_address = "";
    auto server = service::MlaServer::Start(engine::CreateEngine, SmallEngineOptions(TinyModel()),
                                            server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    (*server)->SetServing(true);
    auto client = client::MlaServeClient::Connect(address);
    Rng rng(std::random_device{}());
    ASSERT_TRUE(client->CreateSequence("s").ok());
    ASSERT_TRUE(client->AppendKv("s", 0, 0, Tensor2(RandomBf16(40 * 576, 1.0, rng), 40, 576)).ok());
    auto answer = client->Decode({LatentOn("s", TinyModel(), rng)});
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->size(), 1u);
    client.reset();
    EXPECT_TRUE((*server)->Shutdown(absl::Seconds(5)).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// A call whose deadline passes before its answer is ready fails with DEADLINE_EXCEEDED (the
// engine's checkpoint after device work: 4096 keys take the emulator far longer than 1 ms),
// and the server serves the next one.
TEST(LifecycleTest, AnExpiredDeadlineFailsTheCallAndTheServerGoesOn) {
  engine::EngineOptions options = SmallEngineOptions(TinyModel());
  IntegrationServer server(options);
  Rng rng(std::random_device{}());
  ASSERT_TRUE(server.client().CreateSequence("s").ok());
  ASSERT_TRUE(server.client()
                  .AppendKv("s", 0, 0, Tensor2(RandomBf16(4096 * 576, 1.0, rng), 4096, 576))
                  .ok());
  v1::DecodeRequest request;
  *request.add_queries() = LatentOn("s", server.model(), rng);
  const auto expired = server.client().DecodeRaw(request, absl::Milliseconds(1));
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kDeadlineExceeded);
  const auto later = server.client().DecodeRaw(request, absl::Seconds(10));
  EXPECT_TRUE(later.ok()) << later.status();
}

TEST(LifecycleTest, ACancelledStreamIsAbandonedAndTheServerGoesOn) {
  engine::EngineOptions options = SmallEngineOptions(TinyModel());
  options.max_wait = absl::Milliseconds(400);
  IntegrationServer server(options);
  Rng rng(std::random_device{}());
  ASSERT_TRUE(server.client().CreateSequence("s").ok());
  ASSERT_TRUE(
      server.client().AppendKv("s", 0, 0, Tensor2(RandomBf16(8 * 576, 1.0, rng), 8, 576)).ok());
  auto stream = server.client().OpenDecodeStream(absl::Seconds(10));
  v1::DecodeRequest request;
  *request.add_queries() = LatentOn("s", server.model(), rng);
  ASSERT_TRUE(stream->Send(1, request));
  absl::SleepFor(absl::Milliseconds(50));
  stream->Cancel();
  while (stream->Receive().has_value()) {
  }
  EXPECT_EQ(stream->Finish().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(server.client().Decode({LatentOn("s", server.model(), rng)}).ok());
  // Nothing is left queued once the abandoned request has been dropped.
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (server.server().engine().Stats().queued > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server.server().engine().Stats().queued, 0);
}

TEST(LifecycleTest, ShutdownLetsInFlightCallsFinishThenRefusesNewOnes) {
  engine::EngineOptions options = SmallEngineOptions(TinyModel());
  options.max_wait = absl::Milliseconds(300);
  IntegrationServer server(options);
  Rng rng(std::random_device{}());
  ASSERT_TRUE(server.client().CreateSequence("s").ok());
  ASSERT_TRUE(
      server.client().AppendKv("s", 0, 0, Tensor2(RandomBf16(8 * 576, 1.0, rng), 8, 576)).ok());
  const v1::DecodeQuery query = LatentOn("s", server.model(), rng);
  auto in_flight = std::async(std::launch::async, [&] { return server.client().Decode({query}); });
  absl::SleepFor(absl::Milliseconds(50));  // queued, waiting for its batch to fill
  EXPECT_TRUE(server.server().Shutdown(absl::Seconds(10)).ok());
  const auto answered = in_flight.get();
  EXPECT_TRUE(answered.ok()) << answered.status();
  client::ClientOptions once;
  once.max_attempts = 1;
  once.timeout = absl::Seconds(2);
  EXPECT_EQ(server.NewClient(once)->Decode({query}).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace mlaserve::integration
