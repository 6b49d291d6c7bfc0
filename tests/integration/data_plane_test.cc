// The same-host data plane through the real server: answers against the golden and bit for
// bit gRPC's, its own transport in the metrics, tenants, a restart, a client that dies with
// calls in flight, and what a client sees when the server offers no plane.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/escaping.h"
#include "common/shm_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/gpu/gpu_lowering.h"
#include "prometheus/registry.h"
#include "server/dataplane/shm_data_plane.h"
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

// Back-pressure: 24 callers, as fast as they can, on two clients of two slots each. The
// server holds no more of their calls than the slots allow (a call waits in its client for a
// free slot, not in the server's memory; the plane counts a call until just after its answer
// is out, by when its slot may hold the next, so at most two a slot), no more registered
// memory than the two regions, and answers every call.
TEST_P(DataPlaneTest, AFloodOfCallersIsHeldToTheClientsSlots) {
  auto grpc = server_.NewClient(Over(client::ClientOptions::DataPlane::kGrpc));
  BatchScenario scenario(*grpc, server_.model(), "flood", 2, GetParam(), 1, 1, rng_);
  client::ClientOptions options = Over(client::ClientOptions::DataPlane::kShm);
  options.shm.slots = 2;
  options.shm.region_bytes = 16 << 20;
  std::vector<std::unique_ptr<client::MlaServeClient>> clients;
  for (int c = 0; c < 2; ++c) clients.push_back(server_.NewClient(options));
  const dataplane::ShmDataPlane& plane = *server_.server().shm_plane();
  std::atomic<bool> flooding{true};
  std::atomic<int> answered{0}, failed{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 24; ++t) {
    callers.emplace_back([&, t] {
      client::DecodeBatchBuffers buffers(scenario.request(), scenario.width());
      while (flooding.load()) {
        const absl::Status status = clients[t % 2]->DecodeBatch(scenario.request(), buffers.output);
        (status.ok() ? answered : failed).fetch_add(1);
      }
    });
  }
  int most_in_flight = 0;
  uint64_t most_registered = 0;
  const absl::Time end = absl::Now() + absl::Seconds(1.5);
  while (absl::Now() < end) {
    most_in_flight = std::max(most_in_flight, plane.calls_in_flight());
    most_registered = std::max(most_registered, plane.registered_bytes());
    absl::SleepFor(absl::Microseconds(200));
  }
  flooding = false;
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(answered.load(), 24);
  EXPECT_LE(most_in_flight, 2 * 4);
  EXPECT_LE(most_registered, uint64_t{2} * options.shm.region_bytes);
  // The plane counts a call out just after its answer is out, so a moment after the last.
  const absl::Time settled = absl::Now() + absl::Seconds(5);
  while (plane.calls_in_flight() > 0 && absl::Now() < settled)
    absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(plane.calls_in_flight(), 0);
}

// Arrays a caller allocates from the client (AllocateArray) lie in its region: a call whose
// tensors and answer buffers are there names them by offset, copying them neither into a slot
// nor out of it. Here a slot holds half the call: from ordinary memory the call does not
// fit; from the client's arrays it is answered, bit for bit as over gRPC.
TEST_P(DataPlaneTest, ArraysInTheRegionAreNeitherCopiedInNorOut) {
  auto grpc = server_.NewClient(Over(client::ClientOptions::DataPlane::kGrpc));
  BatchScenario scenario(*grpc, server_.model(), "arrays", 8, GetParam(), 2, 1, rng_);
  const client::DecodeBatchRequest& request = scenario.request();
  client::DecodeBatchBuffers over_grpc(request, scenario.width());
  ASSERT_TRUE(grpc->DecodeBatch(request, over_grpc.output).ok());
  uint64_t call_bytes = over_grpc.out.size() + over_grpc.lse.size() * sizeof(float);
  for (const client::BatchTensor* t :
       {&request.q_nope, &request.q_pe, &request.latent, &request.append_rows}) {
    call_bytes += t->bytes();
  }
  client::ClientOptions options = Over(client::ClientOptions::DataPlane::kShm);
  options.shm.slots = 8;
  options.shm.array_bytes = 4 * call_bytes;
  options.shm.region_bytes = shm::DataOffset(8) + 8 * call_bytes;  // a slot: half a call
  auto shm = server_.NewClient(options);

  client::DecodeBatchBuffers from_heap(request, scenario.width());
  EXPECT_EQ(shm->DecodeBatch(request, from_heap.output).code(),
            absl::StatusCode::kFailedPrecondition);

  client::DecodeBatchRequest in_region = request;
  std::vector<client::SharedArray> arrays;
  for (client::BatchTensor* t :
       {&in_region.q_nope, &in_region.q_pe, &in_region.latent, &in_region.append_rows}) {
    if (!t->present()) continue;
    arrays.push_back(shm->AllocateArray(t->bytes()));
    std::memcpy(arrays.back().bytes.data(), t->data, t->bytes());
    t->data = arrays.back().bytes.data();
  }
  client::SharedArray out = shm->AllocateArray(over_grpc.out.size());
  client::SharedArray lse = shm->AllocateArray(over_grpc.lse.size() * sizeof(float));
  client::DecodeBatchOutput output{
      out.bytes,
      std::span<float>(reinterpret_cast<float*>(lse.bytes.data()), over_grpc.lse.size()),
      {}};
  const double before = Requests(server_, "shm");
  ASSERT_TRUE(shm->DecodeBatch(in_region, output).ok());
  EXPECT_EQ(Requests(server_, "shm"), before + 1);
  EXPECT_TRUE(std::equal(out.bytes.begin(), out.bytes.end(), over_grpc.out.begin()));
  EXPECT_TRUE(std::equal(output.lse.begin(), output.lse.end(), over_grpc.lse.begin()));
  EXPECT_EQ(output.plans.size(), 8u);
}

INSTANTIATE_TEST_SUITE_P(Spaces, DataPlaneTest,
                         ::testing::Values(engine::QuerySpace::kHead, engine::QuerySpace::kLatent),
                         [](const auto& param_info) {
                           return param_info.param == engine::QuerySpace::kHead ? "Head" : "Latent";
                         });

// Sum of a histogram's observations (all label sets).
double HistogramSum(IntegrationServer& server, const std::string& name) {
  double total = 0;
  for (const prometheus::MetricFamily& family : server.server().metrics().registry()->Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      total += metric.histogram.sample_sum;
    }
  }
  return total;
}

// On a GPU device (TestGpu: the fake one unless MLASERVE_TEST_GPU names one) the region is
// mapped into the device and a call's queries are read from it in place, the device's upload
// being their one copy: the answers are the golden's and gRPC's bit for bit, and the metrics
// count the queries as read in place over the plane and uploaded over gRPC (and over the
// plane too for a call of fewer bytes than gpu::kInPlaceMinBytes).
class DataPlaneOnAGpuTest : public ::testing::TestWithParam<engine::QuerySpace> {
 protected:
  static engine::EngineOptions OnTheGpu() {
    engine::EngineOptions options = SmallEngineOptions(TinyModel());
    options.gpu = TestGpu();
    return options;
  }
  IntegrationServer server_{OnTheGpu(), "", WithDataPlane()};
  Rng rng_{std::random_device{}()};
};

TEST_P(DataPlaneOnAGpuTest, QueriesAreReadFromTheRegionInPlace) {
  auto shm = server_.NewClient(Over(client::ClientOptions::DataPlane::kShm));
  auto grpc = server_.NewClient(Over(client::ClientOptions::DataPlane::kGrpc));
  constexpr int kSequences = 12, kSq = 2;
  BatchScenario scenario(*grpc, server_.model(), "gpu-plane", kSequences, GetParam(), kSq, 1, rng_);
  const engine::ModelConfig& m = server_.model();
  const double query_bytes =
      double{kSequences} * kSq * m.heads * 2 *
      (GetParam() == engine::QuerySpace::kHead ? m.dn + m.dr : m.dk_latent());
  const client::DecodeBatchRequest fp32 = scenario.WithOutput(v1::DTYPE_FP32);
  const std::string in_place = "mlaserve_batch_query_bytes_in_place";
  const double before = HistogramSum(server_, in_place);
  client::DecodeBatchBuffers over_shm(fp32, scenario.width());
  ASSERT_TRUE(shm->DecodeBatch(fp32, over_shm.output).ok());
  EXPECT_EQ(HistogramSum(server_, in_place) - before, query_bytes);
  scenario.ExpectGolden(over_shm.out, over_shm.lse);

  client::DecodeBatchBuffers over_grpc(fp32, scenario.width());
  ASSERT_TRUE(grpc->DecodeBatch(fp32, over_grpc.output).ok());
  EXPECT_EQ(HistogramSum(server_, in_place) - before, query_bytes);  // uploaded this time
  EXPECT_EQ(over_shm.out, over_grpc.out);
  EXPECT_EQ(over_shm.lse, over_grpc.lse);

  BatchScenario lone(*grpc, server_.model(), "gpu-plane-lone", 1, GetParam(), 1, 1, rng_);
  ASSERT_LT(query_bytes / (kSequences * kSq), gpu::kInPlaceMinBytes);
  client::DecodeBatchBuffers small(lone.request(), lone.width());
  ASSERT_TRUE(shm->DecodeBatch(lone.request(), small.output).ok());
  EXPECT_EQ(HistogramSum(server_, in_place) - before, query_bytes);
}

INSTANTIATE_TEST_SUITE_P(Spaces, DataPlaneOnAGpuTest,
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
