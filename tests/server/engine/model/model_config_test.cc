#include "server/engine/model/model_config.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlaserve::engine {
namespace {

using ::testing::HasSubstr;

// vLLM's yarn_get_mscale, written out again here so the test does not share the code it
// checks: scale = (0.1 * mscale_all_dim * ln(factor) + 1)^2 / sqrt(qk_nope + qk_rope).
double ReferenceScale(double factor, double mscale_all_dim) {
  const double mscale = 0.1 * mscale_all_dim * std::log(factor) + 1.0;
  return mscale * mscale / std::sqrt(128.0 + 64.0);
}

TEST(ModelConfigTest, DeepSeekV3PresetMatchesItsConfigJson) {
  const absl::StatusOr<ModelConfig> config = PresetModelConfig("deepseek-v3");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->heads, 128);
  EXPECT_EQ(config->layers, 61);
  EXPECT_EQ(config->dk_latent(), 576);
  EXPECT_EQ(config->dqk(), 192);
  EXPECT_EQ(config->dv, 128);
  EXPECT_FLOAT_EQ(config->softmax_scale, static_cast<float>(ReferenceScale(40.0, 1.0)));
  EXPECT_NEAR(config->softmax_scale, 0.1352338, 1e-7);  // the number the docs quote
}

TEST(ModelConfigTest, KimiK2PresetMatchesItsConfigJson) {
  const absl::StatusOr<ModelConfig> config = PresetModelConfig("kimi-k2");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->heads, 64);
  EXPECT_EQ(config->layers, 61);
  EXPECT_EQ(config->dk_latent(), 576);
  EXPECT_FLOAT_EQ(config->softmax_scale, static_cast<float>(ReferenceScale(32.0, 1.0)));
  EXPECT_NEAR(config->softmax_scale, 0.1308608, 1e-7);
}

TEST(ModelConfigTest, YarnScaleIsPlainOneOverSqrtWithoutScaling) {
  EXPECT_DOUBLE_EQ(YarnSoftmaxScale(192, YarnScaling{1.0, 1.0}), 1.0 / std::sqrt(192.0));
  EXPECT_DOUBLE_EQ(YarnSoftmaxScale(192, YarnScaling{40.0, 0.0}), 1.0 / std::sqrt(192.0));
}

TEST(ModelConfigTest, OverridesApply) {
  const absl::StatusOr<ModelConfig> config =
      PresetModelConfig("deepseek-v3", ModelConfigOverrides{.layers = 2, .softmax_scale = 0.5f});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->layers, 2);
  EXPECT_EQ(config->softmax_scale, 0.5f);
  EXPECT_EQ(config->heads, 128);
}

TEST(ModelConfigTest, RejectsUnknownPresetNamingTheKnownOnes) {
  const absl::StatusOr<ModelConfig> config = PresetModelConfig("llama");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("deepseek-v3"));
  EXPECT_THAT(config.status().message(), HasSubstr("kimi-k2"));
}

TEST(ModelConfigTest, RejectsLayerOverrideBeyondTheModel) {
  const absl::StatusOr<ModelConfig> config =
      PresetModelConfig("kimi-k2", ModelConfigOverrides{.layers = 62});
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("layers"));
}

TEST(ModelConfigTest, RejectsBadOverridesThroughValidate) {
  EXPECT_THAT(PresetModelConfig("kimi-k2", ModelConfigOverrides{.layers = 0}).status().message(),
              HasSubstr("layers"));
  EXPECT_THAT(
      PresetModelConfig("kimi-k2", ModelConfigOverrides{.softmax_scale = -1.0f}).status().message(),
      HasSubstr("softmax_scale"));
}

ModelConfig Custom() {
  return ModelConfig{.name = "custom",
                     .heads = 8,
                     .dn = 32,
                     .dr = 16,
                     .dl = 64,
                     .dv = 32,
                     .layers = 3,
                     .softmax_scale = 0.2f};
}

TEST(ModelConfigTest, CustomDimsValidate) {
  const ModelConfig config = Custom();
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_EQ(config.dk_latent(), 80);
  EXPECT_EQ(config.dqk(), 48);
}

TEST(ModelConfigTest, ValidateNamesTheBadField) {
  struct Case {
    void (*mutate)(ModelConfig&);
    const char* field;
  };
  const Case cases[] = {
      {[](ModelConfig& c) { c.name.clear(); }, "name"},
      {[](ModelConfig& c) { c.heads = 0; }, "heads"},
      {[](ModelConfig& c) { c.dn = -1; }, "dn"},
      {[](ModelConfig& c) { c.dr = 0; }, "dr"},
      {[](ModelConfig& c) { c.dl = 1 << 20; }, "dl"},
      {[](ModelConfig& c) { c.dv = 0; }, "dv"},
      {[](ModelConfig& c) { c.layers = 0; }, "layers"},
      // The scale is never implied: an unset one is an error, not 1/sqrt(dqk).
      {[](ModelConfig& c) { c.softmax_scale = 0.0f; }, "softmax_scale"},
      {[](ModelConfig& c) { c.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
       "softmax_scale"},
      {[](ModelConfig& c) { c.softmax_scale = std::numeric_limits<float>::infinity(); },
       "softmax_scale"},
  };
  for (const Case& c : cases) {
    ModelConfig config = Custom();
    c.mutate(config);
    const absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(status.message(), HasSubstr(c.field));
  }
}

}  // namespace
}  // namespace mlaserve::engine
