// The FP8 latent cache through the wire: formats chosen per prefix and sequence, both append
// forms, forks, decodes in both spaces (hybrid over an FP8 prefix included) against the fp64
// golden of the unquantised rows, and every malformed FP8 request refused by name.

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tensor_helpers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/mla/fp8_accuracy.h"
#include "server/engine/model/model_weights.h"
#include "tests/integration/integration_server.h"

namespace mlaserve::integration {
namespace {

using ::testing::HasSubstr;

// SnapMLA's bounds belong to its tests' data scale (docs/numerics.md, "FP8 accuracy").
constexpr double kScale = 0.1;

void ExpectWithinSnapMlaBounds(const client::DecodeOutput& answer, const GoldenOutput& golden,
                               const std::string& what) {
  const AttentionErrors e = CompareWithGolden(answer.out, answer.lse, golden);
  EXPECT_LE(e.rel_l2, 5e-2) << what;
  EXPECT_LE(e.cos_dist, 1e-3) << what;
  EXPECT_LE(e.lse_max_err, 2e-2) << what;
}

TEST(Fp8CacheTest, SequencesOnAnFp8PrefixDecodeAgainstTheGoldenThroughTheWire) {
  engine::EngineOptions options = SmallEngineOptions(TinyModel());
  options.matrix_tflops = 1;  // B_theta < 1: the prefix's group runs hybrid
  options.hbm_tbps = 100;
  IntegrationServer server(options);
  client::MlaServeClient& client = server.client();
  const engine::ModelConfig& m = server.model();
  const int width = m.dk_latent();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Rng rng(seed);

  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->kv_formats_size(), 2);
  EXPECT_EQ(info->kv_formats(0).dtype(), v1::KV_DTYPE_BF16);
  EXPECT_EQ(info->kv_formats(0).bytes_per_token(), 1152);
  EXPECT_EQ(info->kv_formats(1).dtype(), v1::KV_DTYPE_FP8);
  EXPECT_EQ(info->kv_formats(1).bytes_per_token(), 644);
  EXPECT_EQ(info->kv_formats(1).page_tokens(), info->page_size() * 1152 / 644);
  EXPECT_EQ(info->default_kv_dtype(), v1::KV_DTYPE_BF16);

  const int prefix_tokens = 70, layer = 1;
  const std::vector<Bf16> latent =
      RandomBf16(static_cast<size_t>(m.layers) * prefix_tokens * width, kScale, rng);
  ASSERT_TRUE(client
                  .RegisterPrefix("P", "", Tensor3(latent, m.layers, prefix_tokens, width),
                                  v1::KV_DTYPE_FP8)
                  .ok());
  const std::vector<Bf16> prefix_rows(
      latent.begin() + static_cast<ptrdiff_t>(layer) * prefix_tokens * width,
      latent.begin() + static_cast<ptrdiff_t>(layer + 1) * prefix_tokens * width);

  // x: bf16 rows, quantised by the server; y: rows quantised here and sent as FP8 (644
  // bytes a row); z: a fork of x with rows of its own.
  absl::StatusOr<v1::Sequence> x = client.CreateSequence("x", "P");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->kv_dtype(), v1::KV_DTYPE_FP8);
  ASSERT_TRUE(client.CreateSequence("y", "P", v1::KV_DTYPE_FP8).ok());
  const std::vector<Bf16> x_rows = RandomBf16(static_cast<size_t>(40) * width, kScale, rng);
  const std::vector<Bf16> y_rows = RandomBf16(static_cast<size_t>(9) * width, kScale, rng);
  ASSERT_TRUE(client.AppendKv("x", layer, prefix_tokens, Tensor2(x_rows, 40, width)).ok());
  ASSERT_TRUE(
      client.AppendKv("y", layer, prefix_tokens, client::QuantizeFp8Rows(y_rows, m.dl, m.dr)).ok());
  absl::StatusOr<v1::Sequence> z = client.ForkSequence("x", "z");
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(z->kv_dtype(), v1::KV_DTYPE_FP8);
  const std::vector<Bf16> z_rows = RandomBf16(static_cast<size_t>(3) * width, kScale, rng);
  ASSERT_TRUE(client.AppendKv("z", layer, prefix_tokens + 40, Tensor2(z_rows, 3, width)).ok());

  auto concat = [](std::initializer_list<const std::vector<Bf16>*> parts) {
    std::vector<Bf16> all;
    for (const auto* p : parts) all.insert(all.end(), p->begin(), p->end());
    return all;
  };
  const std::vector<std::vector<Bf16>> rows = {concat({&prefix_rows, &x_rows}),
                                               concat({&prefix_rows, &y_rows}),
                                               concat({&prefix_rows, &x_rows, &z_rows})};
  absl::StatusOr<engine::ModelWeights> weights = engine::ModelWeights::FromSeed(m, kWeightsSeed);
  ASSERT_TRUE(weights.ok()) << weights.status();
  std::vector<v1::DecodeQuery> queries;
  std::vector<GoldenOutput> goldens;
  const char* ids[] = {"x", "y", "z"};
  for (int i = 0; i < 3; ++i) {  // head space: one group on P
    const std::vector<Bf16> q_nope = RandomBf16(static_cast<size_t>(m.heads) * m.dn, kScale, rng);
    const std::vector<Bf16> q_pe = RandomBf16(static_cast<size_t>(m.heads) * m.dr, kScale, rng);
    queries.push_back(client::HeadSpaceQuery(ids[i], layer, 1, Tensor3(q_nope, 1, m.heads, m.dn),
                                             Tensor3(q_pe, 1, m.heads, m.dr)));
    goldens.push_back(GoldenHeadSpace(m, weights->Layer(layer), rows[i], q_nope, q_pe, 1));
  }
  const std::vector<Bf16> q_latent =
      RandomBf16(static_cast<size_t>(2) * m.heads * width, kScale, rng);
  // Latent space on layer 0, where y holds the prefix's rows only (one query per layer).
  const std::vector<Bf16> prefix_layer0(
      latent.begin(), latent.begin() + static_cast<ptrdiff_t>(prefix_tokens) * width);
  queries.push_back(client::LatentQuery("y", 0, 2, Tensor3(q_latent, 2, m.heads, width)));
  goldens.push_back(GoldenLatent(m, prefix_layer0, q_latent, 2));

  absl::StatusOr<std::vector<client::DecodeOutput>> answers =
      client.Decode(queries, v1::DTYPE_FP32);
  ASSERT_TRUE(answers.ok()) << answers.status();
  for (size_t i = 0; i < answers->size(); ++i) {
    const std::string what = absl::StrCat("query ", i);
    ExpectWithinSnapMlaBounds((*answers)[i], goldens[i], what);
    EXPECT_EQ((*answers)[i].plan.absorb_kv_dtype(), v1::KV_DTYPE_FP8) << what;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ((*answers)[i].plan.formulation(), v1::FORMULATION_HYBRID) << i;
  }

  for (const char* id : ids) EXPECT_TRUE(client.ReleaseSequence(id).ok());
  EXPECT_TRUE(client.ReleasePrefix("P").ok());
}

TEST(Fp8CacheTest, RowsQuantisedByTheClientEqualRowsQuantisedByTheServer) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  client::MlaServeClient& client = server.client();
  const engine::ModelConfig& m = server.model();
  const int width = m.dk_latent();
  Rng rng(std::random_device{}());
  const std::vector<Bf16> rows = RandomBf16(static_cast<size_t>(57) * width, kScale, rng);
  ASSERT_TRUE(client.CreateSequence("server", "", v1::KV_DTYPE_FP8).ok());
  ASSERT_TRUE(client.CreateSequence("client", "", v1::KV_DTYPE_FP8).ok());
  ASSERT_TRUE(client.AppendKv("server", 0, 0, Tensor2(rows, 57, width)).ok());
  ASSERT_TRUE(client.AppendKv("client", 0, 0, client::QuantizeFp8Rows(rows, m.dl, m.dr)).ok());
  const std::vector<Bf16> q = RandomBf16(static_cast<size_t>(m.heads) * width, kScale, rng);
  std::vector<v1::DecodeQuery> queries = {
      client::LatentQuery("server", 0, 1, Tensor3(q, 1, m.heads, width)),
      client::LatentQuery("client", 0, 1, Tensor3(q, 1, m.heads, width))};
  absl::StatusOr<std::vector<client::DecodeOutput>> answers =
      client.Decode(queries, v1::DTYPE_FP32);
  ASSERT_TRUE(answers.ok()) << answers.status();
  EXPECT_EQ((*answers)[0].out, (*answers)[1].out);
  EXPECT_EQ((*answers)[0].lse, (*answers)[1].lse);
}

TEST(Fp8CacheTest, MalformedFp8RequestsAreRefusedByNameAndChangeNothing) {
  IntegrationServer server(SmallEngineOptions(TinyModel()));
  client::MlaServeClient& client = server.client();
  const engine::ModelConfig& m = server.model();
  const int width = m.dk_latent();
  Rng rng(std::random_device{}());
  ASSERT_TRUE(client.CreateSequence("f", "", v1::KV_DTYPE_FP8).ok());
  ASSERT_TRUE(client.CreateSequence("b", "", v1::KV_DTYPE_BF16).ok());

  absl::StatusOr<v1::Sequence> unknown =
      client.CreateSequence("u", "", static_cast<v1::KvDtype>(7));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("kv_dtype"));

  const std::vector<Bf16> rows = RandomBf16(static_cast<size_t>(4) * width, kScale, rng);
  const v1::Fp8Rows good = client::QuantizeFp8Rows(rows, m.dl, m.dr);
  const absl::Status on_bf16 = client.AppendKv("b", 0, 0, good);
  EXPECT_EQ(on_bf16.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(on_bf16.message(), HasSubstr("chunks[0]"));

  const int64_t row_bytes = m.dl + 4 + 2 * m.dr;
  v1::Fp8Rows bad = good;
  const float zero = 0.0f;
  std::memcpy(bad.mutable_data()->data() + 2 * row_bytes + m.dl, &zero, 4);
  const absl::Status bad_scale = client.AppendKv("f", 0, 0, bad);
  EXPECT_EQ(bad_scale.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_scale.message(), HasSubstr("rows[2] has scale 0"));

  bad = good;
  bad.mutable_data()->pop_back();
  const absl::Status short_data = client.AppendKv("f", 0, 0, bad);
  EXPECT_EQ(short_data.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_data.message(), HasSubstr("fp8_rows.data"));

  absl::StatusOr<v1::Sequence> f = client.GetSequence("f");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->layer_lengths(0), 0);  // nothing was appended
  ASSERT_TRUE(client.AppendKv("f", 0, 0, good).ok());
  EXPECT_EQ(client.GetSequence("f")->layer_lengths(0), 4);

  // A sequence on an FP8 prefix cannot be bf16.
  const std::vector<Bf16> latent =
      RandomBf16(static_cast<size_t>(m.layers) * 3 * width, kScale, rng);
  ASSERT_TRUE(
      client.RegisterPrefix("P", "", Tensor3(latent, m.layers, 3, width), v1::KV_DTYPE_FP8).ok());
  absl::StatusOr<v1::Sequence> mismatch = client.CreateSequence("s", "P", v1::KV_DTYPE_BF16);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("kv_dtype"));
}

}  // namespace
}  // namespace mlaserve::integration
