#include "server/engine/model/model_weights.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/core/matmul.h"
#include "kernels/core/random_fill.h"
#include "server/engine/model/safetensors.h"
#include "tests/testing/scratch_dir.h"

namespace mlaserve::engine {
namespace {

using ::testing::HasSubstr;

ModelConfig SmallModel(int layers = 3) {
  return ModelConfig{.name = "small",
                     .heads = 4,
                     .dn = 16,
                     .dr = 8,
                     .dl = 64,
                     .dv = 8,
                     .layers = layers,
                     .softmax_scale = 0.25f};
}

std::string TempPath(absl::string_view name) {
  static const ::mlaserve::testing::ScratchDir dir("model_weights_test");
  return dir.Path(std::string(name));
}

// kv_b_proj tensors for `layers` layers, as a checkpoint would hold them.
struct Checkpoint {
  std::vector<std::vector<std::byte>> storage;
  std::vector<SafetensorsTensor> tensors;

  void Add(std::string name, std::string dtype, std::vector<int64_t> shape,
           std::vector<std::byte> bytes) {
    storage.push_back(std::move(bytes));
    tensors.push_back({std::move(name), std::move(dtype), std::move(shape), storage.back()});
  }
  std::string Write(absl::string_view name) {
    // Spans into `storage` stay valid: its elements' buffers never move.
    const std::string path = TempPath(name);
    EXPECT_TRUE(WriteSafetensors(path, tensors).ok());
    return path;
  }
};

template <typename T>
std::vector<std::byte> ToBytes(std::span<const T> values) {
  const auto bytes = std::as_bytes(values);
  return {bytes.begin(), bytes.end()};
}

std::vector<int64_t> KvBProjShape(const ModelConfig& c) {
  return {static_cast<int64_t>(c.heads) * (c.dn + c.dv), c.dl};
}

TEST(ModelWeightsTest, SeededWeightsAreDeterministicPerSeedAndLayer) {
  const ModelConfig config = SmallModel();
  const absl::StatusOr<ModelWeights> a = ModelWeights::FromSeed(config, 7);
  const absl::StatusOr<ModelWeights> b = ModelWeights::FromSeed(config, 7);
  const absl::StatusOr<ModelWeights> c = ModelWeights::FromSeed(config, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const size_t bytes = a->KvBProj(0).size_bytes();
  for (int layer = 0; layer < config.layers; ++layer) {
    EXPECT_EQ(std::memcmp(a->KvBProj(layer).data(), b->KvBProj(layer).data(), bytes), 0);
    EXPECT_NE(std::memcmp(a->KvBProj(layer).data(), c->KvBProj(layer).data(), bytes), 0);
  }
  EXPECT_NE(std::memcmp(a->KvBProj(0).data(), a->KvBProj(1).data(), bytes), 0);
  EXPECT_EQ(a->bytes(), static_cast<int64_t>(bytes) * config.layers);
}

TEST(ModelWeightsTest, SeededWeightsAreApproximatelyNormalWithVarianceOneOverDl) {
  ModelConfig config = SmallModel(2);
  config.heads = 8;
  config.dn = 128;
  config.dv = 128;
  config.dl = 512;
  const absl::StatusOr<ModelWeights> w = ModelWeights::FromSeed(config, 1);
  ASSERT_TRUE(w.ok());
  double sum = 0, sum_sq = 0, within_one_sigma = 0;
  int64_t n = 0;
  const double sigma = 1.0 / std::sqrt(512.0);
  for (int layer = 0; layer < config.layers; ++layer) {
    for (Bf16 x : w->KvBProj(layer)) {
      const double v = x.ToFloat();
      sum += v;
      sum_sq += v * v;
      within_one_sigma += std::abs(v) < sigma;
      ++n;
    }
  }
  const double mean = sum / n;
  const double variance = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean / sigma, 0.0, 0.01);
  EXPECT_NEAR(variance * 512.0, 1.0, 0.02);
  // A normal puts 68.3 % within one sigma, a uniform 57.7 %: the shape is close to normal.
  EXPECT_NEAR(within_one_sigma / n, 0.683, 0.02);
}

TEST(ModelWeightsTest, SeededKNopeHasUnitVarianceForUnitLatents) {
  ModelConfig config = SmallModel(1);
  config.dn = 128;
  config.dl = 512;
  const absl::StatusOr<ModelWeights> w = ModelWeights::FromSeed(config, 3);
  ASSERT_TRUE(w.ok());
  const UpProjection up = w->Layer(0);
  Rng rng(11);
  NormalSampler<double> normal;
  double sum_sq = 0;
  int n = 0;
  for (int t = 0; t < 64; ++t) {
    std::vector<double> c_kv(config.dl);
    for (double& x : c_kv) x = normal(rng);
    for (int h = 0; h < config.heads; ++h) {
      for (int d = 0; d < config.dn; ++d) {
        double k = 0;
        for (int l = 0; l < config.dl; ++l) k += c_kv[l] * up.w_uk(h, d, l).ToFloat();
        sum_sq += k * k;
        ++n;
      }
    }
  }
  EXPECT_NEAR(sum_sq / n, 1.0, 0.08);
}

TEST(ModelWeightsTest, LayerViewsSplitKvBProjRowsPerHead) {
  const ModelConfig config = SmallModel();
  const absl::StatusOr<ModelWeights> w = ModelWeights::FromSeed(config, 5);
  ASSERT_TRUE(w.ok());
  for (int layer = 0; layer < config.layers; ++layer) {
    const UpProjection up = w->Layer(layer);
    const std::span<const Bf16> kv_b = w->KvBProj(layer);
    ASSERT_EQ(up.heads(), config.heads);
    ASSERT_EQ(up.dn(), config.dn);
    ASSERT_EQ(up.dv(), config.dv);
    ASSERT_EQ(up.dl(), config.dl);
    const int rows_per_head = config.dn + config.dv;
    for (int h = 0; h < config.heads; ++h) {
      for (int c = 0; c < config.dl; ++c) {
        for (int d = 0; d < config.dn; ++d) {
          ASSERT_EQ(up.w_uk(h, d, c), kv_b[(h * rows_per_head + d) * config.dl + c]);
        }
        for (int d = 0; d < config.dv; ++d) {
          ASSERT_EQ(up.w_uv(h, d, c), kv_b[(h * rows_per_head + config.dn + d) * config.dl + c]);
        }
      }
    }
  }
}

// The matrix unit's copy holds each head's projections where kv_b_proj holds them: q . W_UK
// read from the tiles gives the bits of q . W_UK read from the checkpoint layout, and
// o . W_UV^T (an NN product on the transposed tiles) is the exact product within rounding.
// DeepSeek's widths, where the tiles' blocks are whole, and few rows, the serving case.
TEST(ModelWeightsTest, MatrixTilesHoldEachHeadsProjectionsInTheirPlace) {
  ModelConfig config = SmallModel(2);
  config.dn = 128;
  config.dv = 128;
  config.dl = 512;
  absl::StatusOr<ModelWeights> w = ModelWeights::FromSeed(config, 6);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->KvBProjTiles(0).empty());
  ASSERT_TRUE(w->AddMatrixTiles().ok());
  EXPECT_EQ(w->tile_bytes(), w->bytes());
  Rng rng(7);
  const int rows = 3;
  std::vector<Bf16> q(rows * config.dn), o(rows * config.dl);
  FillNormal(q, 1.0, rng);
  FillNormal(o, 1.0, rng);
  for (int layer = 0; layer < config.layers; ++layer) {
    const UpProjection up = w->Layer(layer);
    for (int h = 0; h < config.heads; ++h) {
      const int64_t uk = int64_t{h} * (config.dn + config.dv) * config.dl;
      const int64_t uv = uk + int64_t{config.dn} * config.dl;
      std::vector<float> plain(rows * config.dl), tiled(rows * config.dl);
      MatmulBf16(false, rows, config.dl, config.dn, q.data(), config.dn, &up.w_uk(h, 0, 0),
                 config.dl, plain.data(), config.dl, false, 128);
      MatmulBf16Tiled(false, rows, config.dl, config.dn, q.data(), config.dn,
                      w->KvBProjTiles(layer).data() + uk, tiled.data(), config.dl, false);
      ASSERT_EQ(plain, tiled) << "layer " << layer << " head " << h;
      std::vector<float> out(rows * config.dv);
      MatmulBf16Tiled(false, rows, config.dv, config.dl, o.data(), config.dl,
                      w->KvBProjTiles(layer).data() + uv, out.data(), config.dv, false);
      for (int r = 0; r < rows; ++r) {
        for (int d = 0; d < config.dv; ++d) {
          double exact = 0;
          for (int c = 0; c < config.dl; ++c)
            exact += double(o[r * config.dl + c].ToFloat()) * up.w_uv(h, d, c).ToFloat();
          ASSERT_NEAR(out[r * config.dv + d], exact, 1e-5 * config.dl) << h << "," << r << "," << d;
        }
      }
    }
  }
}

TEST(ModelWeightsTest, LoadsBf16CheckpointExactlyAndIgnoresOtherTensors) {
  const ModelConfig config = SmallModel();
  const absl::StatusOr<ModelWeights> seeded = ModelWeights::FromSeed(config, 9);
  ASSERT_TRUE(seeded.ok());
  Checkpoint ckpt;
  const std::vector<float> unrelated(10, 1.0f);
  ckpt.Add("model.embed_tokens.weight", "F32", {10}, ToBytes(std::span<const float>(unrelated)));
  for (int layer = 0; layer < config.layers; ++layer) {
    ckpt.Add(ModelWeights::KvBProjTensorName(layer), "BF16", KvBProjShape(config),
             ToBytes(seeded->KvBProj(layer)));
  }
  const absl::StatusOr<ModelWeights> loaded =
      ModelWeights::FromSafetensors(config, ckpt.Write("bf16"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (int layer = 0; layer < config.layers; ++layer) {
    EXPECT_EQ(std::memcmp(loaded->KvBProj(layer).data(), seeded->KvBProj(layer).data(),
                          seeded->KvBProj(layer).size_bytes()),
              0);
  }
}

TEST(ModelWeightsTest, LoadsFewerLayersThanTheCheckpointHas) {
  const ModelConfig full = SmallModel(3);
  const absl::StatusOr<ModelWeights> seeded = ModelWeights::FromSeed(full, 2);
  Checkpoint ckpt;
  for (int layer = 0; layer < full.layers; ++layer) {
    ckpt.Add(ModelWeights::KvBProjTensorName(layer), "BF16", KvBProjShape(full),
             ToBytes(seeded->KvBProj(layer)));
  }
  const absl::StatusOr<ModelWeights> loaded =
      ModelWeights::FromSafetensors(SmallModel(1), ckpt.Write("fewer"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config().layers, 1);
  EXPECT_EQ(loaded->KvBProj(0)[17], seeded->KvBProj(0)[17]);
}

TEST(ModelWeightsTest, ConvertsF32ToBf16RoundingToNearestEven) {
  const ModelConfig config = SmallModel(1);
  const int64_t n = KvBProjShape(config)[0] * config.dl;
  std::vector<float> values(n, 0.5f);
  // Ties go to the even mantissa; anything past the tie goes up.
  values[0] = 1.0f + 0x1p-8f;                // tie between 0x3f80 and 0x3f81 -> 0x3f80
  values[1] = 1.0f + 3 * 0x1p-8f;            // tie between 0x3f81 and 0x3f82 -> 0x3f82
  values[2] = 1.0f + 0x1p-8f + 0x1p-20f;     // past the tie -> 0x3f81
  values[3] = -(1.0f + 0x1p-8f - 0x1p-20f);  // below the tie -> 0xbf80
  Checkpoint ckpt;
  ckpt.Add(ModelWeights::KvBProjTensorName(0), "F32", KvBProjShape(config),
           ToBytes(std::span<const float>(values)));
  const absl::StatusOr<ModelWeights> loaded =
      ModelWeights::FromSafetensors(config, ckpt.Write("f32"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::span<const Bf16> w = loaded->KvBProj(0);
  EXPECT_EQ(w[0].bits, 0x3f80);
  EXPECT_EQ(w[1].bits, 0x3f82);
  EXPECT_EQ(w[2].bits, 0x3f81);
  EXPECT_EQ(w[3].bits, 0xbf80);
  EXPECT_EQ(w[4].bits, 0x3f00);  // 0.5 is exact
}

TEST(ModelWeightsTest, MissingLayerIsNotFoundNamingTheTensor) {
  const ModelConfig config = SmallModel(3);
  const absl::StatusOr<ModelWeights> seeded = ModelWeights::FromSeed(config, 2);
  Checkpoint ckpt;
  for (int layer = 0; layer < 2; ++layer) {
    ckpt.Add(ModelWeights::KvBProjTensorName(layer), "BF16", KvBProjShape(config),
             ToBytes(seeded->KvBProj(layer)));
  }
  const absl::Status s = ModelWeights::FromSafetensors(config, ckpt.Write("missing")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.2.self_attn.kv_b_proj.weight"));
}

TEST(ModelWeightsTest, RejectsWrongShape) {
  const ModelConfig config = SmallModel(1);
  const std::vector<uint16_t> values(static_cast<size_t>(KvBProjShape(config)[0]) * config.dl);
  Checkpoint ckpt;
  // Same element count, rows and columns swapped.
  ckpt.Add(ModelWeights::KvBProjTensorName(0), "BF16", {config.dl, KvBProjShape(config)[0]},
           ToBytes(std::span<const uint16_t>(values)));
  const absl::Status s = ModelWeights::FromSafetensors(config, ckpt.Write("shape")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("has shape [64, 96]"));
  EXPECT_THAT(s.message(), HasSubstr("kv_b_proj"));
}

TEST(ModelWeightsTest, RejectsUnsupportedDtype) {
  const ModelConfig config = SmallModel(1);
  const std::vector<uint16_t> values(static_cast<size_t>(KvBProjShape(config)[0]) * config.dl);
  Checkpoint ckpt;
  ckpt.Add(ModelWeights::KvBProjTensorName(0), "F16", KvBProjShape(config),
           ToBytes(std::span<const uint16_t>(values)));
  const absl::Status s = ModelWeights::FromSafetensors(config, ckpt.Write("f16")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dtype F16"));
}

TEST(ModelWeightsTest, RejectsFp8CheckpointsSayingWhatToDo) {
  const ModelConfig config = SmallModel(1);
  const std::vector<uint8_t> values(static_cast<size_t>(KvBProjShape(config)[0]) * config.dl);
  const std::vector<float> scales(4, 1.0f);
  Checkpoint ckpt;
  ckpt.Add(ModelWeights::KvBProjTensorName(0), "F8_E4M3", KvBProjShape(config),
           ToBytes(std::span<const uint8_t>(values)));
  ckpt.Add("model.layers.0.self_attn.kv_b_proj.weight_scale_inv", "F32", {4},
           ToBytes(std::span<const float>(scales)));
  const absl::Status s = ModelWeights::FromSafetensors(config, ckpt.Write("fp8")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("FP8"));
  EXPECT_THAT(s.message(), HasSubstr("weight_scale_inv"));
  EXPECT_THAT(s.message(), HasSubstr("BF16"));
}

TEST(ModelWeightsTest, PropagatesMalformedFileAndInvalidConfig) {
  const std::string path = TempPath("garbage");
  std::ofstream(path, std::ios::binary) << "this is not a safetensors file";
  EXPECT_EQ(ModelWeights::FromSafetensors(SmallModel(), path).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelConfig bad = SmallModel();
  bad.softmax_scale = 0.0f;
  EXPECT_THAT(ModelWeights::FromSeed(bad, 1).status().message(), HasSubstr("softmax_scale"));
}

}  // namespace
}  // namespace mlaserve::engine
