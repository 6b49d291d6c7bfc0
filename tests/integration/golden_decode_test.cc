// End-to-end numerics: the real engine behind the real server, through the C++ client,
// against the fp64 golden computed here from the same inputs (fresh random data each run).

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/engine/model/model_weights.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

struct SequenceSpec {
  std::string id;
  int suffix_tokens = 0;
  int sq = 1;
};

// Registers a prefix (if `prefix_tokens` > 0), creates the sequences on it, appends each
// sequence's own rows to `layer`, then decodes one query per sequence in one call, in head
// or latent space, and checks every answer against the golden over prefix + suffix rows.
// Returns the plans. `decoder`, when given, makes the Decode call (a client with options of
// its own).
std::vector<v1::DecodePlan> DecodeAndCheck(IntegrationServer& server, const std::string& tag,
                                           int prefix_tokens,
                                           const std::vector<SequenceSpec>& specs,
                                           engine::QuerySpace space, int layer, Rng& rng,
                                           client::MlaServeClient* decoder = nullptr) {
  const engine::ModelConfig& model = server.model();
  const int width = model.dk_latent();
  client::MlaServeClient& client = server.client();
  std::vector<Bf16> prefix_rows;
  const std::string prefix_id = prefix_tokens > 0 ? absl::StrCat(tag, "/prefix") : "";
  if (prefix_tokens > 0) {
    const std::vector<Bf16> latent =
        RandomBf16(static_cast<size_t>(model.layers) * prefix_tokens * width, 1.0, rng);
    EXPECT_TRUE(
        client.RegisterPrefix(prefix_id, "", Tensor3(latent, model.layers, prefix_tokens, width))
            .ok());
    prefix_rows.assign(latent.begin() + static_cast<ptrdiff_t>(layer) * prefix_tokens * width,
                       latent.begin() + static_cast<ptrdiff_t>(layer + 1) * prefix_tokens * width);
  }
  absl::StatusOr<engine::ModelWeights> weights =
      engine::ModelWeights::FromSeed(model, kWeightsSeed);
  EXPECT_TRUE(weights.ok()) << weights.status();

  std::vector<v1::DecodeQuery> queries;
  std::vector<GoldenOutput> goldens;
  for (const SequenceSpec& spec : specs) {
    const std::string id = absl::StrCat(tag, "/", spec.id);
    EXPECT_TRUE(client.CreateSequence(id, prefix_id).ok());
    const std::vector<Bf16> suffix =
        RandomBf16(static_cast<size_t>(spec.suffix_tokens) * width, 1.0, rng);
    EXPECT_TRUE(
        client.AppendKv(id, layer, prefix_tokens, Tensor2(suffix, spec.suffix_tokens, width)).ok());
    std::vector<Bf16> rows = prefix_rows;
    rows.insert(rows.end(), suffix.begin(), suffix.end());
    const size_t token_heads = static_cast<size_t>(spec.sq) * model.heads;
    if (space == engine::QuerySpace::kLatent) {
      const std::vector<Bf16> q = RandomBf16(token_heads * width, 1.0, rng);
      queries.push_back(
          client::LatentQuery(id, layer, spec.sq, Tensor3(q, spec.sq, model.heads, width)));
      goldens.push_back(GoldenLatent(model, rows, q, spec.sq));
    } else {
      const std::vector<Bf16> q_nope = RandomBf16(token_heads * model.dn, 1.0, rng);
      const std::vector<Bf16> q_pe = RandomBf16(token_heads * model.dr, 1.0, rng);
      queries.push_back(client::HeadSpaceQuery(id, layer, spec.sq,
                                               Tensor3(q_nope, spec.sq, model.heads, model.dn),
                                               Tensor3(q_pe, spec.sq, model.heads, model.dr)));
      goldens.push_back(GoldenHeadSpace(model, weights->Layer(layer), rows, q_nope, q_pe, spec.sq));
    }
  }
  absl::StatusOr<std::vector<client::DecodeOutput>> answers =
      (decoder != nullptr ? *decoder : client).Decode(queries, v1::DTYPE_FP32);
  EXPECT_TRUE(answers.ok()) << answers.status();
  std::vector<v1::DecodePlan> plans;
  if (!answers.ok()) return plans;
  EXPECT_EQ(answers->size(), specs.size());
  const bool head = space == engine::QuerySpace::kHead;
  for (size_t i = 0; i < answers->size(); ++i) {
    SCOPED_TRACE(absl::StrCat(tag, " query ", i, head ? " (head space)" : " (latent)"));
    EXPECT_TRUE(testing::AllClose((*answers)[i].out, goldens[i].out,
                                  head ? kHeadSpaceOutTolerance : kLatentOutTolerance, true));
    EXPECT_TRUE(testing::AllClose((*answers)[i].lse, goldens[i].lse,
                                  head ? kHeadSpaceLseTolerance : kLatentLseTolerance, false));
    plans.push_back((*answers)[i].plan);
  }
  for (const SequenceSpec& spec : specs) {
    EXPECT_TRUE(client.ReleaseSequence(absl::StrCat(tag, "/", spec.id)).ok());
  }
  if (!prefix_id.empty()) {
    EXPECT_TRUE(client.ReleasePrefix(prefix_id).ok());
  }
  return plans;
}

const std::vector<SequenceSpec> kMixedLengths{
    {"a", 1, 1}, {"b", 31, 1}, {"c", 33, 2}, {"d", 150, 2}};

TEST(GoldenDecodeTest, LatentAndHeadSpaceWithoutAPrefix) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  Rng rng(std::random_device{}());
  DecodeAndCheck(server, "latent", 0, kMixedLengths, engine::QuerySpace::kLatent, 1, rng);
  DecodeAndCheck(server, "head", 0, kMixedLengths, engine::QuerySpace::kHead, 0, rng);
}

double DecodeCallsAnswered(IntegrationServer& server) {
  for (const prometheus::MetricFamily& family : server.server().metrics().registry()->Collect()) {
    if (family.name != "mlaserve_requests_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      bool decode_ok = true;
      for (const auto& label : metric.label) {
        if (label.name == "rpc") decode_ok &= label.value == "Decode";
        if (label.name == "code") decode_ok &= label.value == "OK";
      }
      if (decode_ok) return metric.counter.value;
    }
  }
  return -1;
}

// Queries whose bytes exceed ClientOptions::decode_call_bytes go out as several calls in
// order (here one query each), and the answers are the same as from one call.
TEST(GoldenDecodeTest, ADecodeOverTheClientsCallBytesIsSplitIntoCallsInOrder) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  Rng rng(std::random_device{}());
  client::ClientOptions options;
  options.decode_call_bytes = 1;
  std::unique_ptr<client::MlaServeClient> splitting = server.NewClient(options);
  const double before = DecodeCallsAnswered(server);
  DecodeAndCheck(server, "split-latent", 0, kMixedLengths, engine::QuerySpace::kLatent, 1, rng,
                 splitting.get());
  DecodeAndCheck(server, "split-head", 0, kMixedLengths, engine::QuerySpace::kHead, 0, rng,
                 splitting.get());
  EXPECT_EQ(DecodeCallsAnswered(server) - before, 2.0 * kMixedLengths.size());
}

// Three sequences on one prefix, far below B_theta at the paper's rates: absorb only.
TEST(GoldenDecodeTest, ASharedPrefixBelowTheThresholdRunsAbsorbOnly) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  Rng rng(std::random_device{}());
  const std::vector<SequenceSpec> specs{{"x", 5, 1}, {"y", 40, 1}, {"z", 1, 2}};
  for (engine::QuerySpace space : {engine::QuerySpace::kHead, engine::QuerySpace::kLatent}) {
    const std::vector<v1::DecodePlan> plans =
        DecodeAndCheck(server, space == engine::QuerySpace::kHead ? "below/head" : "below/latent",
                       70, specs, space, 1, rng);
    for (const v1::DecodePlan& plan : plans) {
      EXPECT_EQ(plan.formulation(), v1::FORMULATION_ABSORB);
      if (space == engine::QuerySpace::kHead) {
        EXPECT_GT(plan.b_theta(), 3);
      }
    }
  }
}

// The same group above the threshold: a device whose matrix rate is tiny next to its memory
// bandwidth makes B_theta < 1, so the head-space group runs naive over the prefix and absorb
// over the suffixes (TyphoonMLA), and must still agree with the golden.
TEST(GoldenDecodeTest, ASharedPrefixAboveTheThresholdRunsHybrid) {
  engine::EngineOptions options = SmallEngineOptions(TinyModel());
  options.matrix_tflops = 1;
  options.hbm_tbps = 100;
  IntegrationServer server(options);
  auto info = server.client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_LT(info->naive_thresholds(0).b_theta(), 1.0);
  Rng rng(std::random_device{}());
  const std::vector<SequenceSpec> specs{{"x", 5, 1}, {"y", 40, 1}, {"z", 1, 1}};
  const std::vector<v1::DecodePlan> plans =
      DecodeAndCheck(server, "above", 70, specs, engine::QuerySpace::kHead, 1, rng);
  ASSERT_EQ(plans.size(), 3u);
  for (const v1::DecodePlan& plan : plans) {
    EXPECT_EQ(plan.formulation(), v1::FORMULATION_HYBRID);
    EXPECT_EQ(plan.prefix_id(), "above/prefix");
    EXPECT_EQ(plan.group_size(), 3);
    EXPECT_LT(plan.b_theta(), 1.0);
  }
}

// The real model shape: DeepSeek-V3's 128 heads and YaRN scale, two layers.
TEST(GoldenDecodeTest, DeepSeekV3TwoLayers) {
  engine::ModelConfigOverrides two_layers;
  two_layers.layers = 2;
  absl::StatusOr<engine::ModelConfig> model = engine::PresetModelConfig("deepseek-v3", two_layers);
  ASSERT_TRUE(model.ok()) << model.status();
  IntegrationServer server(SmallEngineOptions(*model));
  Rng rng(std::random_device{}());
  const std::vector<SequenceSpec> specs{{"p", 77, 1}, {"q", 20, 2}};
  DecodeAndCheck(server, "v3/head", 0, specs, engine::QuerySpace::kHead, 1, rng);
  DecodeAndCheck(server, "v3/latent", 0, specs, engine::QuerySpace::kLatent, 0, rng);
}

// The same through a GPU device (TestGpu: the fake one unless MLASERVE_TEST_GPU names one).
TEST(GoldenDecodeTest, AGpuDeviceAnswersBothSpacesAndTheHybridThroughTheWire) {
  engine::EngineOptions options = SmallEngineOptions(TinyModel());
  options.gpu = TestGpu();
  options.matrix_tflops = 1;  // B_theta < 1: the prefix group runs hybrid
  options.hbm_tbps = 100;
  IntegrationServer server(options);
  auto info = server.client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->devices_size(), 1);
  EXPECT_EQ(info->devices(0).kind(), "gpu");
  EXPECT_EQ(info->devices(0).profile(), TestGpu());
  EXPECT_FALSE(info->devices(0).description().empty());
  EXPECT_GT(info->devices(0).memory_bytes(), 0);
  Rng rng(std::random_device{}());
  DecodeAndCheck(server, "gpu/latent", 0, kMixedLengths, engine::QuerySpace::kLatent, 1, rng);
  DecodeAndCheck(server, "gpu/head", 0, kMixedLengths, engine::QuerySpace::kHead, 0, rng);
  const std::vector<SequenceSpec> specs{{"x", 5, 1}, {"y", 40, 1}, {"z", 1, 1}};
  for (const v1::DecodePlan& plan :
       DecodeAndCheck(server, "gpu/hybrid", 70, specs, engine::QuerySpace::kHead, 1, rng)) {
    EXPECT_EQ(plan.formulation(), v1::FORMULATION_HYBRID);
  }
}

}  // namespace
}  // namespace mlaserve::integration
