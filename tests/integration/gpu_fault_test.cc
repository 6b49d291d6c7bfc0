// A GPU that faults under the real server (the fake GPU, told to fail as after an Xid): the
// call in flight fails UNAVAILABLE naming the fault, health goes NOT_SERVING, later calls fail
// at once with the same reason, the server asks to be stopped, and /metrics says so.

#include <atomic>
#include <memory>
#include <random>
#include <string>

#include "client/health_check.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kernels/gpu/fake_gpu_runtime.h"
#include "server/engine/devices/gpu_attention_device.h"
#include "server/engine/engine_impl.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

using ::testing::HasSubstr;

TEST(GpuFaultTest, AFaultStopsServingFailsCallsAndStopsTheServer) {
  auto runtime = std::make_shared<gpu::FakeGpuRuntime>();
  auto factory =
      [runtime](engine::EngineOptions options) -> absl::StatusOr<std::unique_ptr<engine::Engine>> {
    std::vector<std::unique_ptr<engine::AttentionDevice>> devices;
    devices.push_back(std::make_unique<engine::GpuAttentionDevice>(runtime, "fake-gpu"));
    auto engine = engine::EngineImpl::Create(std::move(options), std::move(devices));
    if (!engine.ok()) return engine.status();
    return std::unique_ptr<engine::Engine>(std::move(*engine));
  };
  std::atomic<int> stop_requests{0};
  service::ServerOptions server_options;
  server_options.listen_address = "127.0.0.1:0";
  server_options.metrics_address = "";
  server_options.stop_server = [&stop_requests] { ++stop_requests; };
  auto server = service::MlaServer::Start(factory, SmallEngineOptions(TinyModel()), server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->WarmUp().ok());
  (*server)->SetServing(true);
  const std::string target = absl::StrCat("127.0.0.1:", (*server)->port());
  auto client = client::MlaServeClient::Connect(target);
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  Rng rng(std::random_device{}());
  const engine::ModelConfig model = TinyModel();
  ASSERT_TRUE(client->CreateSequence("s").ok());
  ASSERT_TRUE(client->AppendKv("s", 0, 0, Tensor2(RandomBf16(40 * 576, 1.0, rng), 40, 576)).ok());
  const auto query = [&] {
    return client::LatentQuery(
        "s", 0, 1,
        Tensor3(RandomBf16(static_cast<size_t>(model.heads) * 576, 1.0, rng), 1, model.heads, 576));
  };
  ASSERT_TRUE(client->Decode({query()}).ok());

  runtime->InjectFault("Xid 48: double-bit ECC error");
  auto failed = client->Decode({query()});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("Xid 48"));
  EXPECT_EQ(*client::CheckHealth(channel, ""), client::ServingStatus::kNotServing);
  EXPECT_EQ(*client::CheckHealth(channel, "mlaserve.v1.MlaServe"),
            client::ServingStatus::kNotServing);
  EXPECT_EQ(stop_requests.load(), 1);
  EXPECT_THAT(std::string((*server)->fault().message()), HasSubstr("Xid 48"));

  const int64_t runs = runtime->programs_run();
  auto later = client->Decode({query()});
  EXPECT_EQ(later.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(later.status().message()), HasSubstr("Xid 48"));
  EXPECT_EQ(runtime->programs_run(), runs) << "nothing reaches the faulted device";
  EXPECT_EQ(stop_requests.load(), 1) << "asked to stop once";
  client.reset();
  (*server)->Shutdown(absl::Seconds(5)).IgnoreError();
}

}  // namespace
}  // namespace mlaserve::integration
