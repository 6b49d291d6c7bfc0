// The same-host data plane through the real server: answers against the golden and bit for
// bit gRPC's, its own transport in the metrics, tenants, a restart, a client that dies with
// calls in flight, and what a client sees when the server offers no plane.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/service/tenancy.h"
#include "tests/integration/batch_scenario.h"
#include "tests/integration/data_plane_server.h"

namespace mlaserve::integration {
namespace {

using ::testing::StartsWith;

double Requests(IntegrationServer& server, const std::string& transport) {
  double total = 0;
  for (const prometheus::MetricFamily& family : server.server().metrics().registry()->Collect()) {
    if (family.name != "mlaserve_requests_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      bool match = false;
      for (const auto& label : metric.label) {
        if (label.name == "transport") match = label.value == transport;
      }
      if (match) total += metric.counter.value;
    }
  }
  return total;
}

client::ClientOptions Over(client::ClientOptions::DataPlane plane) {
  client::ClientOptions options;
  options.data_plane = plane;
  options.shm.region_bytes = 64 << 20;
  options.shm.slots = 4;
  return options;
}

class DataPlaneTest : public ::testing::TestWithParam<engine::QuerySpace> {
 protected:
  IntegrationServer server_{SmallEngineOptions(TinyModel()), "", WithDataPlane()};
  Rng rng_{std::random_device{}()};
};

TEST_P(DataPlaneTest, AnswersMatchTheGoldenAndGrpcBitForBit) {
  auto shm = server_.NewClient(Over(client::ClientOptions::DataPlane::kShm));
  auto grpc = server_.NewClient(Over(client::ClientOptions::DataPlane::kGrpc));
  BatchScenario scenario(*grpc, server_.model(), "plane", 6, GetParam(), 2, 1, rng_);
  const client::DecodeBatchRequest fp32 = scenario.WithOutput(v1::DTYPE_FP32);
  const double before = Requests(server_, "shm");
  client::DecodeBatchBuffers over_shm(fp32, scenario.width());
  ASSERT_TRUE(shm->DecodeBatch(fp32, over_shm.output).ok());
  EXPECT_EQ(Requests(server_, "shm"), before + 1);  // it went over the plane
  scenario.ExpectGolden(over_shm.out, over_shm.lse);
  ASSERT_EQ(over_shm.output.plans.size(), 6u);
  // The same call again over gRPC (its appends are already there: a no-op).
  client::DecodeBatchBuffers over_grpc(fp32, scenario.width());
  ASSERT_TRUE(grpc->DecodeBatch(fp32, over_grpc.output).ok());
  EXPECT_EQ(over_shm.out, over_grpc.out);
  EXPECT_EQ(over_shm.lse, over_grpc.lse);
  for (int step = 0; step < 3; ++step) {  // steps in bf16 reuse the slots
    scenario.NextStep(rng_);
    client::DecodeBatchBuffers bf16(scenario.request(), scenario.width());
    ASSERT_TRUE(shm->DecodeBatch(scenario.request(), bf16.output).ok());
  }
  EXPECT_EQ(Requests(server_, "shm"), before + 4);
}

TEST_P(DataPlaneTest, BadBatchesAreNamedAndChangeNothing) {
  auto shm = server_.NewClient(Over(client::ClientOptions::DataPlane::kShm));
  BatchScenario scenario(*shm, server_.model(), "bad", 3, GetParam(), 1, 1, rng_);
  const std::vector<int64_t> before = scenario.Lengths(*shm);
  client::DecodeBatchRequest request = scenario.request();
  client::BatchTensor& q = request.head_space() ? request.q_nope : request.latent;
  std::vector<Bf16> poisoned(static_cast<const Bf16*>(q.data),
                             static_cast<const Bf16*>(q.data) + q.elements());
  poisoned[7] = Bf16::FromFloat(INFINITY);
  q.data = poisoned.data();
  client::DecodeBatchBuffers buffers(request, scenario.width());
  absl::Status status = shm->DecodeBatch(request, buffers.output);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              StartsWith(request.head_space() ? "packed.head.q_nope[0]: element 7"
                                              : "packed.latent[0]: element 7"));
  request = scenario.request();
  request.sequence_ids[2] = "bad/missing";
  status = shm->DecodeBatch(request, buffers.output);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), StartsWith("packed.sequence_ids[2]"));
  EXPECT_EQ(scenario.Lengths(*shm), before);
  // The plane still serves the client after its refusals.
  EXPECT_TRUE(shm->DecodeBatch(scenario.request(), buffers.output).ok());
}

TEST_P(DataPlaneTest, ManyCallersShareTheSlotsAndEachGetsItsOwnAnswers) {
  auto grpc = server_.NewClient(Over(client::ClientOptions::DataPlane::kGrpc));
  auto shm = server_.NewClient(Over(client::ClientOptions::DataPlane::kShm));
  constexpr int kThreads = 6;  // more callers than the client's 4 slots
  std::vector<std::unique_ptr<BatchScenario>> scenarios;
  for (int t = 0; t < kThreads; ++t) {
    scenarios.push_back(std::make_unique<BatchScenario>(
        *grpc, server_.model(), absl::StrCat("caller", t), 2, GetParam(), 1, 1, rng_));
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  std::vector<std::unique_ptr<client::DecodeBatchBuffers>> buffers(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    const client::DecodeBatchRequest request = scenarios[t]->WithOutput(v1::DTYPE_FP32);
    buffers[t] = std::make_unique<client::DecodeBatchBuffers>(request, scenarios[t]->width());
    threads.emplace_back(
        [&, t, request] { results[t] = shm->DecodeBatch(request, buffers[t]->output); });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    SCOPED_TRACE(absl::StrCat("caller ", t));
    ASSERT_TRUE(results[t].ok()) << results[t];
    scenarios[t]->ExpectGolden(buffers[t]->out, buffers[t]->lse);
  }
}

INSTANTIATE_TEST_SUITE_P(Spaces, DataPlaneTest,
                         ::testing::Values(engine::QuerySpace::kHead, engine::QuerySpace::kLatent),
                         [](const auto& param_info) {
                           return param_info.param == engine::QuerySpace::kHead ? "Head" : "Latent";
                         });

TEST(DataPlaneLifeTest, AClientOfAServerWithoutThePlaneStaysOnGrpc) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  Rng rng(std::random_device{}());
  auto auto_client = server.NewClient(Over(client::ClientOptions::DataPlane::kAuto));
  BatchScenario scenario(*auto_client, server.model(), "none", 2, engine::QuerySpace::kLatent, 1, 1,
                         rng);
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  EXPECT_TRUE(auto_client->DecodeBatch(scenario.request(), buffers.output).ok());
  auto required = server.NewClient(Over(client::ClientOptions::DataPlane::kShm));
  const absl::Status status = required->DecodeBatch(scenario.request(), buffers.output);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("no shared-memory plane"));
  absl::StatusOr<v1::OpenDataPlaneResponse> opened = required->OpenDataPlane("shm", 1);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(opened.status().message()), StartsWith("kind: this server offers no"));
}

TEST(DataPlaneLifeTest, ARestartVoidsTheRegionAndTheClientRegistersAgain) {
  const service::ServerOptions options = WithDataPlane();
  auto server = std::make_unique<IntegrationServer>(SmallEngineOptions(TinyModel()), "", options);
  const int port = server->server().port();
  auto client = server->NewClient(Over(client::ClientOptions::DataPlane::kShm));
  Rng rng(std::random_device{}());
  BatchScenario first(*client, server->model(), "one", 2, engine::QuerySpace::kLatent, 1, 0, rng);
  client::DecodeBatchBuffers buffers(first.request(), first.width());
  ASSERT_TRUE(client->DecodeBatch(first.request(), buffers.output).ok());
  absl::StatusOr<std::shared_ptr<client::ShmChannel>> before = client->SharedMemoryPlane();
  ASSERT_TRUE(before.ok());
  const std::string instance = (*before)->instance_id();
  server.reset();  // the KV cache goes with it (no state dir)
  server = std::make_unique<IntegrationServer>(SmallEngineOptions(TinyModel()), "", options, port);
  BatchScenario second(*client, server->model(), "two", 2, engine::QuerySpace::kLatent, 1, 0, rng);
  ASSERT_TRUE(client->DecodeBatch(second.request(), buffers.output).ok());
  absl::StatusOr<std::shared_ptr<client::ShmChannel>> after = client->SharedMemoryPlane();
  ASSERT_TRUE(after.ok());
  EXPECT_NE((*after)->instance_id(), instance);
  EXPECT_EQ(server->server().shm_plane()->clients(), 1);
}

TEST(DataPlaneLifeTest, AClientThatDiesWithACallInFlightLeavesNothingBehind) {
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", WithDataPlane());
  Rng rng(std::random_device{}());
  BatchScenario scenario(server.client(), server.model(), "dies", 64, engine::QuerySpace::kLatent,
                         1, 0, rng);
  absl::StatusOr<v1::OpenDataPlaneResponse> ticket = server.client().OpenDataPlane("shm", 1);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  std::vector<std::string> args{MLASERVE_SHM_DYING_CLIENT,
                                ticket->plane().address(),
                                absl::BytesToHexString(ticket->ticket()),
                                ticket->instance_id(),
                                "1",
                                std::to_string(server.model().heads)};
  for (const std::string& id : scenario.request().sequence_ids) args.push_back(id);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 0);  // it registered and published
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  const dataplane::ShmDataPlane& plane = *server.server().shm_plane();
  while ((plane.clients() > 0 || plane.registered_bytes() > 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(plane.clients(), 0);
  EXPECT_EQ(plane.registered_bytes(), 0u);
  // The server serves on: another client's call over the plane.
  auto shm = server.NewClient(Over(client::ClientOptions::DataPlane::kShm));
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  EXPECT_TRUE(shm->DecodeBatch(scenario.request(), buffers.output).ok());
}

TEST(DataPlaneLifeTest, ADrainAnswersTheCallsInFlightAndRefusesNewOnes) {
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", WithDataPlane());
  Rng rng(std::random_device{}());
  BatchScenario scenario(server.client(), server.model(), "drain", 64, engine::QuerySpace::kHead, 2,
                         1, rng);
  auto shm = server.NewClient(Over(client::ClientOptions::DataPlane::kShm));
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  ASSERT_TRUE(shm->SharedMemoryPlane().ok());
  absl::Status in_flight;
  std::thread call([&] { in_flight = shm->DecodeBatch(scenario.request(), buffers.output); });
  // Drained once the server has taken the call (its 64 head-space queries take far longer
  // than noticing that).
  const dataplane::ShmDataPlane& plane = *server.server().shm_plane();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (plane.calls_in_flight() == 0 && absl::Now() < deadline) {
  }
  EXPECT_EQ(plane.calls_in_flight(), 1);
  EXPECT_TRUE(server.server().Shutdown(absl::Seconds(10)).ok());
  call.join();
  EXPECT_TRUE(in_flight.ok()) << in_flight;  // answered, not cut
  const absl::Status after = shm->DecodeBatch(scenario.request(), buffers.output);
  EXPECT_FALSE(after.ok());
}

TEST(DataPlaneLifeTest, ATenantReachesOnlyItsOwnSequencesOverThePlane) {
  const std::string json =
      absl::StrCat(R"({"tenants": [{"name": "alpha", "token_sha256": ")",
                   service::TokenHash("alpha-token"), R"("}, {"name": "beta", "token_sha256": ")",
                   service::TokenHash("beta-token"), R"("}, {"name": "reader", "token_sha256": ")",
                   service::TokenHash("reader-token"), R"(", "rights": ["read", "decode"]}]})");
  absl::StatusOr<std::unique_ptr<service::Tenancy>> tenancy =
      service::Tenancy::FromTokensFile(json, "tokens.json", {64});
  ASSERT_TRUE(tenancy.ok()) << tenancy.status();
  service::ServerOptions options = WithDataPlane();
  options.tenancy = *std::move(tenancy);
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", options);
  auto client_of = [&](const char* token, client::ClientOptions::DataPlane plane) {
    client::ClientOptions o = Over(plane);
    o.bearer_token = token;
    return server.NewClient(o);
  };
  auto alpha = client_of("alpha-token", client::ClientOptions::DataPlane::kShm);
  Rng rng(std::random_device{}());
  BatchScenario scenario(*client_of("alpha-token", client::ClientOptions::DataPlane::kGrpc),
                         server.model(), "t", 2, engine::QuerySpace::kLatent, 1, 1, rng);
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  EXPECT_TRUE(alpha->DecodeBatch(scenario.request(), buffers.output).ok());
  // The same ids from another tenant name its own (absent) sequences, never alpha's.
  auto beta = client_of("beta-token", client::ClientOptions::DataPlane::kShm);
  absl::Status status = beta->DecodeBatch(scenario.request(), buffers.output);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "packed.sequence_ids[0]: 't/0' is not a sequence");
  // A tenant without the write right may not append over the plane either.
  auto reader = client_of("reader-token", client::ClientOptions::DataPlane::kShm);
  status = reader->DecodeBatch(scenario.request(), buffers.output);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()), StartsWith("packed.append_rows: tenant 'reader'"));
  // Both reached the server over the plane, not by falling back to gRPC.
  EXPECT_EQ(server.server().shm_plane()->clients(), 3);
}

}  // namespace
}  // namespace mlaserve::integration
