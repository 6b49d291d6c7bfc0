#ifndef MLASERVE_SERVER_ENGINE_MODEL_MODEL_CONFIG_H_
#define MLASERVE_SERVER_ENGINE_MODEL_MODEL_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/mla/decode_batch.h"

namespace mlaserve::engine {

// YaRN RoPE scaling as a DeepSeek-style `config.json` carries it under `rope_scaling`; only
// the two fields that change the attention softmax scale are kept.
struct YarnScaling {
  double factor = 1.0;
  double mscale_all_dim = 0.0;
};

// The softmax scale of an MLA model with YaRN, computed the way vLLM and SGLang do for
// DeepSeek (`yarn_get_mscale`, applied twice because it scales both q and k):
//
//   scale  = mscale^2 / sqrt(dqk)
//   mscale = 0.1 * mscale_all_dim * ln(factor) + 1      (1 when factor <= 1)
double YarnSoftmaxScale(int dqk, const YarnScaling& yarn);

// The shapes and constants of one MLA model (docs/numerics.md, "The two MLA formulations"). The
// softmax scale is part of the model, never implied by the dims: a kernel given 1/sqrt(576) or
// 1/sqrt(192) for DeepSeek-V3 computes the wrong attention.
struct ModelConfig {
  std::string name;
  int heads = 0;  // query heads (one latent KV head)
  int dn = 128;   // q/k "nope" head dim
  int dr = 64;    // RoPE dim, shared by all heads
  int dl = 512;   // KV LoRA rank: the latent c_kv width
  int dv = 128;   // value head dim
  int layers = 0;
  float softmax_scale = 0.0f;

  // Width of one latent KV cache row: c_kv then k_pe (576 for DeepSeek-V3).
  int dk_latent() const { return dl + dr; }
  // Width of one expanded (naive-form) key: k_nope then k_pe (192 for DeepSeek-V3).
  int dqk() const { return dn + dr; }

  // INVALID_ARGUMENT naming the first bad field: empty name, a dim or layer count outside
  // [1, 65536], or a softmax scale that is not positive and finite.
  absl::Status Validate() const;

  // The attention shapes in the kernels' terms.
  MlaDims dims() const { return MlaDims{heads, dn, dr, dl, dv, softmax_scale}; }

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// What a deployment may change on a preset: the layer count (a demo serves a few layers of
// a 61-layer model) and the softmax scale (a fine-tune with other RoPE scaling).
struct ModelConfigOverrides {
  std::optional<int> layers = std::nullopt;
  std::optional<float> softmax_scale = std::nullopt;
};

// The presets, by name:
//   "deepseek-v3"  H = 128, 61 layers, YaRN factor 40, mscale_all_dim 1:
//                  mscale = 1.368888, scale = 1.873854 / sqrt(192) = 0.1352338
//   "kimi-k2"      H = 64,  61 layers, YaRN factor 32, mscale_all_dim 1:
//                  mscale = 1.346574, scale = 1.813260 / sqrt(192) = 0.1308608
// Both use dn 128, dr 64, dl 512, dv 128 (from the models' config.json files). A layer
// override may only shrink the model. INVALID_ARGUMENT for an unknown name or a bad override.
absl::StatusOr<ModelConfig> PresetModelConfig(absl::string_view preset,
                                              const ModelConfigOverrides& overrides = {});

// Names PresetModelConfig accepts, for flag help and error messages.
std::vector<std::string> PresetModelNames();

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_MODEL_MODEL_CONFIG_H_
