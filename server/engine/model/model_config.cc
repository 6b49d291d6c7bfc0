#include "server/engine/model/model_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace mlaserve::engine {
namespace {

// Every dim is bounded so that the products the engine forms (heads * dn * dl, pages *
// page_size * width) stay far inside int64.
constexpr int kMaxDim = 65536;

struct Preset {
  absl::string_view name;
  int heads;
  int layers;
  YarnScaling yarn;  // config.json `rope_scaling`
};

// DeepSeek-V3 config.json: num_attention_heads 128, num_hidden_layers 61, rope_scaling
// {type: yarn, factor: 40, mscale: 1.0, mscale_all_dim: 1.0}. Kimi K2 config.json:
// num_attention_heads 64, num_hidden_layers 61, rope_scaling {type: yarn, factor: 32.0,
// mscale: 1.0, mscale_all_dim: 1.0}. Both: qk_nope_head_dim 128, qk_rope_head_dim 64,
// kv_lora_rank 512, v_head_dim 128.
constexpr Preset kPresets[] = {
    {"deepseek-v3", 128, 61, {40.0, 1.0}},
    {"kimi-k2", 64, 61, {32.0, 1.0}},
};

absl::Status CheckDim(absl::string_view field, int value) {
  if (value < 1 || value > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: ", field, " = ", value, " is outside [1, ", kMaxDim, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

double YarnSoftmaxScale(int dqk, const YarnScaling& yarn) {
  const double mscale =
      yarn.factor <= 1.0 ? 1.0 : 0.1 * yarn.mscale_all_dim * std::log(yarn.factor) + 1.0;
  return mscale * mscale / std::sqrt(static_cast<double>(dqk));
}

absl::Status ModelConfig::Validate() const {
  if (name.empty()) return absl::InvalidArgumentError("model config: name is empty");
  for (const auto& [field, value] : {std::pair<absl::string_view, int>{"heads", heads},
                                     {"dn", dn},
                                     {"dr", dr},
                                     {"dl", dl},
                                     {"dv", dv},
                                     {"layers", layers}}) {
    RETURN_IF_ERROR(CheckDim(field, value));
  }
  if (!(softmax_scale > 0.0f) || !std::isfinite(softmax_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: softmax_scale = ", softmax_scale,
                     " must be positive and finite (it is never implied by the head dims)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> PresetModelConfig(absl::string_view preset,
                                              const ModelConfigOverrides& overrides) {
  for (const Preset& p : kPresets) {
    if (p.name != preset) continue;
    ModelConfig config;
    config.name = std::string(p.name);
    config.heads = p.heads;
    config.layers = p.layers;
    config.softmax_scale = static_cast<float>(YarnSoftmaxScale(config.dqk(), p.yarn));
    if (overrides.layers.has_value()) {
      if (*overrides.layers > p.layers) {
        return absl::InvalidArgumentError(absl::StrCat("model config: layers override ",
                                                       *overrides.layers, " exceeds ", p.name,
                                                       "'s ", p.layers, " layers"));
      }
      config.layers = *overrides.layers;
    }
    if (overrides.softmax_scale.has_value()) config.softmax_scale = *overrides.softmax_scale;
    RETURN_IF_ERROR(config.Validate());
    return config;
  }
  return absl::InvalidArgumentError(absl::StrCat("model preset '", preset, "' is unknown (known: ",
                                                 absl::StrJoin(PresetModelNames(), ", "), ")"));
}

std::vector<std::string> PresetModelNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

}  // namespace mlaserve::engine
