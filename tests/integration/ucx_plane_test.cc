// The UCX data plane through the real server on loopback (UCX's TCP sockaddr connection;
// its bytes on whatever transport UCX picks on one host): answers against the golden and bit
// for bit gRPC's, many callers on one endpoint, tenants, bad input named, TLS's refusal, a
// restart, a drain and a client process killed mid-call. ucx_netns_test runs the plane
// between two network namespaces over UCX's TCP transport.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <random>
#include <thread>

#include "absl/strings/escaping.h"
#include "common/ucx_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/service/tenancy.h"
#include "tests/integration/batch_scenario.h"
#include "tests/testing/test_certificates.h"

namespace mlaserve::integration {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Every call answered leaves nothing in flight. The plane counts a call out once its answer
// has left, which may be just after the client has it: wait a little for that.
void ExpectNothingInFlight(const dataplane::UcxDataPlane& plane) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while ((plane.calls_in_flight() > 0 || plane.in_flight_bytes() > 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(plane.calls_in_flight(), 0);
  EXPECT_EQ(plane.in_flight_bytes(), 0u);
}
using Plane = client::ClientOptions::DataPlane;

service::ServerOptions WithUcx(service::ServerOptions options = {}) {
  options.data_plane_ucx = "127.0.0.1:0";
  return options;
}

client::ClientOptions UcxClientOver(Plane plane, const std::string& token = "") {
  client::ClientOptions options;
  options.data_plane = plane;
  options.bearer_token = token;
  return options;
}

double UcxRequests(IntegrationServer& server) {
  double total = 0;
  for (const prometheus::MetricFamily& family : server.server().metrics().registry()->Collect()) {
    if (family.name != "mlaserve_requests_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const auto& label : metric.label) {
        if (label.name == "transport" && label.value == "ucx") total += metric.counter.value;
      }
    }
  }
  return total;
}

class UcxPlaneTest : public ::testing::TestWithParam<engine::QuerySpace> {
 protected:
  IntegrationServer server_{SmallEngineOptions(TinyModel()), "", WithUcx()};
  Rng rng_{std::random_device{}()};
};

TEST_P(UcxPlaneTest, AnswersMatchTheGoldenAndGrpcBitForBit) {
  auto ucx = server_.NewClient(UcxClientOver(Plane::kUcx));
  auto grpc = server_.NewClient(UcxClientOver(Plane::kGrpc));
  BatchScenario scenario(*grpc, server_.model(), "ucx", 6, GetParam(), 2, 1, rng_);
  const client::DecodeBatchRequest fp32 = scenario.WithOutput(v1::DTYPE_FP32);
  const double before = UcxRequests(server_);
  client::DecodeBatchBuffers over_ucx(fp32, scenario.width());
  ASSERT_TRUE(ucx->DecodeBatch(fp32, over_ucx.output).ok());
  EXPECT_EQ(UcxRequests(server_), before + 1);  // it went over the plane
  scenario.ExpectGolden(over_ucx.out, over_ucx.lse);
  ASSERT_EQ(over_ucx.output.plans.size(), 6u);
  client::DecodeBatchBuffers over_grpc(fp32, scenario.width());
  ASSERT_TRUE(grpc->DecodeBatch(fp32, over_grpc.output).ok());
  EXPECT_EQ(over_ucx.out, over_grpc.out);
  EXPECT_EQ(over_ucx.lse, over_grpc.lse);
  for (int step = 0; step < 3; ++step) {  // steps reuse the endpoint's buffers
    scenario.NextStep(rng_);
    client::DecodeBatchBuffers bf16(scenario.request(), scenario.width());
    ASSERT_TRUE(ucx->DecodeBatch(scenario.request(), bf16.output).ok());
  }
  EXPECT_EQ(UcxRequests(server_), before + 4);
  ExpectNothingInFlight(*server_.server().ucx_plane());
}

TEST_P(UcxPlaneTest, ManyCallersOnOneEndpointEachGetTheirOwnAnswers) {
  auto ucx = server_.NewClient(UcxClientOver(Plane::kUcx));
  auto grpc = server_.NewClient(UcxClientOver(Plane::kGrpc));
  std::vector<std::unique_ptr<BatchScenario>> scenarios;
  for (int i = 0; i < 6; ++i) {
    scenarios.push_back(std::make_unique<BatchScenario>(
        *grpc, server_.model(), absl::StrCat("many", i), 3, GetParam(), 1, 0, rng_));
  }
  std::vector<std::unique_ptr<client::DecodeBatchBuffers>> answers(6);
  std::vector<absl::Status> statuses(6);
  std::vector<std::thread> callers;
  for (int i = 0; i < 6; ++i) {
    answers[i] = std::make_unique<client::DecodeBatchBuffers>(scenarios[i]->request(),
                                                              scenarios[i]->width());
    callers.emplace_back(
        [&, i] { statuses[i] = ucx->DecodeBatch(scenarios[i]->request(), answers[i]->output); });
  }
  for (std::thread& t : callers) t.join();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i];
    client::DecodeBatchBuffers again(scenarios[i]->request(), scenarios[i]->width());
    ASSERT_TRUE(grpc->DecodeBatch(scenarios[i]->request(), again.output).ok());
    EXPECT_EQ(answers[i]->out, again.out) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Spaces, UcxPlaneTest,
                         ::testing::Values(engine::QuerySpace::kHead, engine::QuerySpace::kLatent));

TEST(UcxPlaneHostileTest, BadTicketsVersionsAndCallsAreNamedAndTheClientIsServedOn) {
  service::ServerOptions options = WithUcx();
  options.data_plane_ucx_caps.item_bytes = 64 << 10;  // an oversize call is easy to make
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", options);
  client::MlaServeClient& grpc = server.client();
  // The control plane names both versions.
  absl::StatusOr<v1::OpenDataPlaneResponse> old = grpc.OpenDataPlane("ucx", 99);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(old.status().message()),
              HasSubstr("client speaks ucx data-plane version 99; this server speaks version 1"));
  // So does the plane's own hello.
  absl::StatusOr<v1::OpenDataPlaneResponse> ticket = grpc.OpenDataPlane("ucx", ucx::kUcxVersion);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  client::UcxChannelOptions other_version;
  other_version.version = 7;
  absl::StatusOr<std::unique_ptr<client::UcxChannel>> refused =
      client::UcxChannel::Open(*ticket, "127.0.0.1", other_version);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("version: the client speaks ucx data-plane version 7; this server "
                        "speaks version 1"));
  // A ticket is good once; a made-up one never.
  ticket = grpc.OpenDataPlane("ucx", ucx::kUcxVersion);
  ASSERT_TRUE(ticket.ok());
  auto channel = client::UcxChannel::Open(*ticket, "127.0.0.1");
  ASSERT_TRUE(channel.ok()) << channel.status();
  refused = client::UcxChannel::Open(*ticket, "127.0.0.1");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("ticket: not one this server"));
  v1::OpenDataPlaneResponse forged = *ticket;
  forged.set_ticket("0123456789abcdef");
  refused = client::UcxChannel::Open(forged, "127.0.0.1");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  // Malformed calls, each answered by its id with the field named.
  unsigned char header[ucx::kCallIdBytes];
  ucx::WriteCallId(41, header);
  const std::string id41(reinterpret_cast<const char*>(header), sizeof(header));
  absl::StatusOr<v1::DataPlaneAnswer> answer =
      (*channel)->CallRaw(id41, "\xff\xff\xff garbage", absl::Seconds(10));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->call_id(), 41u);
  EXPECT_EQ(answer->status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answer->status().message(),
              StartsWith("call: 11 bytes that are not a DataPlaneCall"));
  answer = (*channel)->CallRaw("abc", "", absl::Seconds(10));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_THAT(answer->status().message(), StartsWith("header: 3 bytes; a call's header is its"));
  v1::DataPlaneCall call;
  call.set_call_id(42);  // not the header's
  answer = (*channel)->CallRaw(id41, call.SerializeAsString(), absl::Seconds(10));
  ASSERT_TRUE(answer.ok());
  EXPECT_THAT(answer->status().message(), StartsWith("call_id: 42 differs from the header's 41"));
  call.set_call_id(41);
  call.mutable_request()->mutable_packed()->add_sequence_ids("x");
  call.set_out_offset(64);
  answer = (*channel)->CallRaw(id41, call.SerializeAsString(), absl::Seconds(10));
  ASSERT_TRUE(answer.ok());
  EXPECT_THAT(answer->status().message(), StartsWith("out_offset: answer areas are the shared"));
  call.set_out_offset(0);
  answer = (*channel)->CallRaw(id41, call.SerializeAsString(), absl::Seconds(10));
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answer->status().message(), StartsWith("request.packed"));
  // A call over --data_plane_ucx_call_mb is refused before its bytes are read.
  Rng rng(std::random_device{}());
  BatchScenario scenario(grpc, server.model(), "big", 8, engine::QuerySpace::kLatent, 1, 0, rng);
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  absl::Status big = (*channel)->Decode(scenario.request(), buffers.output, absl::Seconds(10));
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(big.message()), HasSubstr("(--data_plane_ucx_call_mb)"));
  // And the client is served on.
  BatchScenario small(grpc, server.model(), "small", 1, engine::QuerySpace::kLatent, 1, 0, rng);
  client::DecodeBatchBuffers fits(small.request(), small.width());
  EXPECT_TRUE((*channel)->Decode(small.request(), fits.output, absl::Seconds(10)).ok());
  ExpectNothingInFlight(*server.server().ucx_plane());
}

TEST(UcxPlaneLifeTest, TlsNeedsTheFabricTrusted) {
  testing::TestCertificates certificates;
  service::ServerOptions options = WithUcx();
  options.listen_address = "127.0.0.1:0";
  options.tls.cert_file = certificates.server_cert();
  options.tls.key_file = certificates.server_key();
  absl::StatusOr<std::unique_ptr<service::MlaServer>> server =
      service::MlaServer::Start(engine::CreateEngine, SmallEngineOptions(TinyModel()), options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(server.status().message()),
              AllOf(HasSubstr("--data_plane_ucx: UCX does not encrypt"), HasSubstr("--tls_cert"),
                    HasSubstr("--data_plane_ucx_trusted_fabric")));
  options.data_plane_ucx_trusted_fabric = true;
  server =
      service::MlaServer::Start(engine::CreateEngine, SmallEngineOptions(TinyModel()), options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_NE((*server)->ucx_plane(), nullptr);
  (*server)->Shutdown(absl::Seconds(5)).IgnoreError();
}

TEST(UcxPlaneLifeTest, AutoTakesUcxWhereShmIsNotOfferedAndRestartsOpenItAgain) {
  const service::ServerOptions options = WithUcx();  // no shm socket: only the UCX plane
  auto server = std::make_unique<IntegrationServer>(SmallEngineOptions(TinyModel()), "", options);
  const int port = server->server().port();
  auto client = server->NewClient(UcxClientOver(Plane::kAuto));
  Rng rng(std::random_device{}());
  BatchScenario first(*client, server->model(), "one", 2, engine::QuerySpace::kLatent, 1, 0, rng);
  client::DecodeBatchBuffers buffers(first.request(), first.width());
  ASSERT_TRUE(client->DecodeBatch(first.request(), buffers.output).ok());
  EXPECT_EQ(UcxRequests(*server), 1);
  absl::StatusOr<std::shared_ptr<client::UcxChannel>> before = client->UcxPlane();
  ASSERT_TRUE(before.ok());
  const std::string instance = (*before)->instance_id();
  server.reset();
  server = std::make_unique<IntegrationServer>(SmallEngineOptions(TinyModel()), "", options, port);
  BatchScenario second(*client, server->model(), "two", 2, engine::QuerySpace::kLatent, 1, 0, rng);
  ASSERT_TRUE(client->DecodeBatch(second.request(), buffers.output).ok());
  absl::StatusOr<std::shared_ptr<client::UcxChannel>> after = client->UcxPlane();
  ASSERT_TRUE(after.ok());
  EXPECT_NE((*after)->instance_id(), instance);
  EXPECT_EQ(server->server().ucx_plane()->clients(), 1);
}

TEST(UcxPlaneLifeTest, AClientKilledWithACallInFlightLeavesNothingBehind) {
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", WithUcx());
  Rng rng(std::random_device{}());
  BatchScenario scenario(server.client(), server.model(), "dies", 64, engine::QuerySpace::kLatent,
                         1, 0, rng);
  absl::StatusOr<v1::OpenDataPlaneResponse> ticket = server.client().OpenDataPlane("ucx", 1);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  std::vector<std::string> args{MLASERVE_UCX_PEER,
                                "die",
                                ticket->plane().address(),
                                absl::BytesToHexString(ticket->ticket()),
                                "0",
                                std::to_string(server.model().heads)};
  for (const std::string& id : scenario.request().sequence_ids) args.push_back(id);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;  // killed mid-call
  const dataplane::UcxDataPlane& plane = *server.server().ucx_plane();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((plane.clients() > 0 || plane.calls_in_flight() > 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(plane.clients(), 0);
  EXPECT_EQ(plane.calls_in_flight(), 0);
  EXPECT_EQ(plane.in_flight_bytes(), 0u);
  auto ucx = server.NewClient(UcxClientOver(Plane::kUcx));  // the server serves on
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  EXPECT_TRUE(ucx->DecodeBatch(scenario.request(), buffers.output).ok());
}

TEST(UcxPlaneLifeTest, ADrainAnswersTheCallsInFlightAndRefusesNewOnes) {
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", WithUcx());
  Rng rng(std::random_device{}());
  BatchScenario scenario(server.client(), server.model(), "drain", 64, engine::QuerySpace::kHead, 2,
                         1, rng);
  auto ucx = server.NewClient(UcxClientOver(Plane::kUcx));
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  ASSERT_TRUE(ucx->UcxPlane().ok());
  absl::Status in_flight;
  std::thread call([&] { in_flight = ucx->DecodeBatch(scenario.request(), buffers.output); });
  const dataplane::UcxDataPlane& plane = *server.server().ucx_plane();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (plane.calls_in_flight() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Microseconds(50));
  }
  EXPECT_EQ(plane.calls_in_flight(), 1);
  EXPECT_TRUE(server.server().Shutdown(absl::Seconds(10)).ok());
  call.join();
  EXPECT_TRUE(in_flight.ok()) << in_flight;  // answered, not cut
  EXPECT_FALSE(ucx->DecodeBatch(scenario.request(), buffers.output).ok());
}

TEST(UcxPlaneLifeTest, ATenantReachesOnlyItsOwnSequencesOverThePlane) {
  const std::string json = absl::StrCat(
      R"({"tenants": [{"name": "alpha", "token_sha256": ")", service::TokenHash("alpha-token"),
      R"("}, {"name": "beta", "token_sha256": ")", service::TokenHash("beta-token"), R"("}]})");
  absl::StatusOr<std::unique_ptr<service::Tenancy>> tenancy =
      service::Tenancy::FromTokensFile(json, "tokens.json", {64});
  ASSERT_TRUE(tenancy.ok()) << tenancy.status();
  service::ServerOptions options = WithUcx();
  options.tenancy = *std::move(tenancy);
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", options);
  auto alpha = server.NewClient(UcxClientOver(Plane::kUcx, "alpha-token"));
  Rng rng(std::random_device{}());
  BatchScenario scenario(*server.NewClient(UcxClientOver(Plane::kGrpc, "alpha-token")),
                         server.model(), "t", 2, engine::QuerySpace::kLatent, 1, 1, rng);
  client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
  EXPECT_TRUE(alpha->DecodeBatch(scenario.request(), buffers.output).ok());
  auto beta = server.NewClient(UcxClientOver(Plane::kUcx, "beta-token"));
  const absl::Status status = beta->DecodeBatch(scenario.request(), buffers.output);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "packed.sequence_ids[0]: 't/0' is not a sequence");
  EXPECT_EQ(server.server().ucx_plane()->clients(), 2);  // both over the plane
}

}  // namespace
}  // namespace mlaserve::integration
