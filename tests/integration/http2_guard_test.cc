// The HTTP/2 guard in front of the real server, met by honest clients through the C++ client:
// they never see it (docs/deploy.md, "HTTP/2 guard"). Floods and big bodies are
// resource_limits_test.py's, with a raw HTTP/2 client.

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

using ::testing::HasSubstr;

v1::DecodeRequest OneQuery(const engine::ModelConfig& model, const std::string& sequence,
                           Rng& rng) {
  const int width = model.dk_latent();
  v1::DecodeRequest request;
  *request.add_queries() =
      client::LatentQuery(sequence, 0, 1,
                          Tensor3(RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng), 1,
                                  model.heads, width));
  return request;
}

// As many unary calls as four threads make for 2 s, beside 200 DecodeStreams held open on the
// same connection, which then each answer a request: nothing is ended, nothing fails.
TEST(Http2GuardTest, ManyUnaryCallsBesideTwoHundredOpenStreamsOnOneConnectionAreNeverEnded) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  const listener::GuardedListener* guard = server.server().guard();
  ASSERT_NE(guard, nullptr) << "a plaintext server listens behind the guard by default";
  const engine::ModelConfig& model = server.model();
  Rng rng(std::random_device{}());
  ASSERT_TRUE(server.client().CreateSequence("s").ok());
  ASSERT_TRUE(
      server.client()
          .AppendKv("s", 0, 0,
                    Tensor2(RandomBf16(8 * model.dk_latent(), 1.0, rng), 8, model.dk_latent()))
          .ok());

  auto client = server.NewClient();
  std::vector<std::unique_ptr<client::DecodeStream>> streams;
  for (int i = 0; i < 200; ++i) streams.push_back(client->OpenDecodeStream(absl::Seconds(60)));
  std::atomic<int64_t> answered{0};
  std::atomic<int64_t> failed{0};
  const absl::Time end = absl::Now() + absl::Seconds(2);
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      while (absl::Now() < end) {
        (client->GetServerInfo().ok() ? answered : failed).fetch_add(1);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  std::printf("unary calls beside 200 open streams: %lld in 2 s (%.0f/s), %lld failed\n",
              static_cast<long long>(answered.load()), answered.load() / 2.0,
              static_cast<long long>(failed.load()));
  EXPECT_EQ(failed.load(), 0);

  const v1::DecodeRequest request = OneQuery(model, "s", rng);
  for (auto& stream : streams) ASSERT_TRUE(stream->Send(1, request));
  for (auto& stream : streams) {
    const std::optional<v1::DecodeStreamResponse> answer = stream->Receive();
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->status().code(), 0) << answer->status().message();
    ASSERT_TRUE(stream->WritesDone());
    while (stream->Receive()) {
    }
    EXPECT_TRUE(stream->Finish().ok());
  }
  const listener::GuardedListener::Stats stats = guard->stats();
  EXPECT_EQ(stats.closed_for_resets, 0);
  EXPECT_EQ(stats.closed_for_streams, 0);
  EXPECT_EQ(stats.closed_for_protocol, 0);
  EXPECT_EQ(stats.refused_messages, 0);
}

// A framework's channel stays open for weeks: the streams it opens reach the guard's totals
// (and /metrics) while its connection is still open, not when it ends.
TEST(Http2GuardTest, AnOpenConnectionsStreamsAreCountedBeforeItEnds) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  const listener::GuardedListener* guard = server.server().guard();
  ASSERT_NE(guard, nullptr);
  const int64_t before = guard->stats().streams;
  auto client = server.NewClient();  // one channel, kept open past the checks
  constexpr int kCalls = 25;
  for (int i = 0; i < kCalls; ++i) ASSERT_TRUE(client->GetServerInfo().ok());
  EXPECT_GE(guard->stats().streams - before, kCalls);
  EXPECT_GE(guard->stats().connections_open, 1);
}

// gRPC serves the guard's connections as "fd:N"; the server still tells clients apart by
// their address: a client's stream limit counts all its connections (two channels here).
TEST(Http2GuardTest, AClientsStreamLimitCountsItsConnectionsBehindTheGuard) {
  service::ServerOptions options;
  options.max_streams_per_client = 3;
  IntegrationServer server(SmallEngineOptions(TinyModel()), "", options);
  ASSERT_NE(server.server().guard(), nullptr);
  auto first = server.NewClient();
  auto second = server.NewClient();
  std::vector<std::unique_ptr<client::DecodeStream>> streams;
  for (int i = 0; i < 3; ++i) {
    streams.push_back((i % 2 == 0 ? first : second)->OpenDecodeStream(absl::Seconds(30)));
  }
  // Each of the three answers (so each is registered) before the fourth opens.
  Rng rng(std::random_device{}());
  const v1::DecodeRequest request = OneQuery(server.model(), "missing", rng);
  for (auto& stream : streams) {
    ASSERT_TRUE(stream->Send(1, request));
    ASSERT_TRUE(stream->Receive().has_value());
  }
  auto fourth = second->OpenDecodeStream(absl::Seconds(30));
  fourth->Send(1, request);
  while (fourth->Receive()) {
  }
  const absl::Status refused = fourth->Finish();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("client ipv4:127.0.0.1 already holds 3"));
  for (auto& stream : streams) stream->Cancel();
}

}  // namespace
}  // namespace mlaserve::integration
