// Many clients at once, each growing its own sequence token by token (appends interleaved
// with decodes, some through Decode's own append), all answers checked against the golden.

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

TEST(ConcurrencyTest, ClientsInterleavingAppendsAndDecodesEachGetTheirOwnAnswers) {
  engine::EngineOptions options = SmallEngineOptions(TinyModel());
  options.devices = 2;
  IntegrationServer server(options);
  const engine::ModelConfig model = server.model();
  const int width = model.dk_latent();
  constexpr int kClients = 6;
  constexpr int kSteps = 8;
  const uint64_t seed = std::random_device{}();
  std::vector<std::string> failures(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<client::MlaServeClient> client = server.NewClient();
      Rng rng(seed + c);
      const std::string id = absl::StrCat("client-", c);
      auto fail = [&](const std::string& what) {
        if (failures[c].empty()) failures[c] = what;
      };
      if (!client->CreateSequence(id).ok()) return fail("create");
      std::vector<Bf16> rows = RandomBf16(static_cast<size_t>(3 + c) * width, 1.0, rng);
      if (!client->AppendKv(id, 1, 0, Tensor2(rows, 3 + c, width)).ok()) return fail("prompt");
      for (int step = 0; step < kSteps; ++step) {
        const std::vector<Bf16> token = RandomBf16(width, 1.0, rng);
        const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(model.heads) * width, 1.0, rng);
        v1::DecodeQuery query = client::LatentQuery(id, 1, 1, Tensor3(q, 1, model.heads, width));
        const int64_t position = static_cast<int64_t>(rows.size() / width);
        // Even steps append through AppendKv, odd ones through the Decode itself.
        if (step % 2 == 0) {
          if (!client->AppendKv(id, 1, position, Tensor2(token, 1, width)).ok())
            return fail("append");
        } else {
          client::AppendBeforeDecode(query, Tensor2(token, 1, width), position);
        }
        rows.insert(rows.end(), token.begin(), token.end());
        auto answer = client->Decode({query}, v1::DTYPE_FP32);
        if (!answer.ok()) return fail(absl::StrCat("decode: ", answer.status().ToString()));
        const GoldenOutput golden = GoldenLatent(model, rows, q, 1);
        const auto out = testing::AllClose((*answer)[0].out, golden.out, kLatentOutTolerance, true);
        const auto lse =
            testing::AllClose((*answer)[0].lse, golden.lse, kLatentLseTolerance, false);
        if (!out || !lse)
          return fail(absl::StrCat("step ", step, ": ", out.message(), lse.message()));
      }
      auto sequence = client->GetSequence(id);
      if (!sequence.ok() || sequence->layer_lengths(1) != 3 + c + kSteps) return fail("length");
      if (!client->ReleaseSequence(id).ok()) return fail("release");
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(failures[c], "") << "client " << c;
}

}  // namespace
}  // namespace mlaserve::integration
