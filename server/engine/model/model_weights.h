#ifndef MLASERVE_SERVER_ENGINE_MODEL_MODEL_WEIGHTS_H_
#define MLASERVE_SERVER_ENGINE_MODEL_MODEL_WEIGHTS_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/up_projection.h"
#include "server/engine/kv/anonymous_mapping.h"
#include "server/engine/model/model_config.h"

namespace mlaserve::engine {

// The MLA up-projections of every layer, W_UK [H][Dn][Dl] and W_UV [H][Dv][Dl] in bf16: what
// head-space decode (absorb and naive forms) and the expansion of a prefix's K/V need.
//
// Storage keeps DeepSeek's kv_b_proj layout, one [H * (Dn + Dv)][Dl] matrix per layer whose
// rows per head are Dn rows of W_UK then Dv rows of W_UV, so loading a BF16 checkpoint is a
// straight copy and the per-head W_UK / W_UV are strided views into it.
// Immutable after construction: safe to share between threads.
class ModelWeights {
 public:
  // Demo and test weights: every element is an approximately normal value with variance
  // 1/Dl, so that k_nope = c_kv . W_UK^T has unit-ish variance for unit-variance c_kv. The
  // generator is counter-based (splitmix64 of seed and element index, four 16-bit uniforms
  // summed), so the same seed gives the same bits on every machine, build and thread count;
  // it fills in parallel. DeepSeek-V3's 61 layers (2 GiB) take 1.3 s on two cores.
  static absl::StatusOr<ModelWeights> FromSeed(const ModelConfig& config, uint64_t seed);

  // Reads `model.layers.{i}.self_attn.kv_b_proj.weight` for i in [0, config.layers) from a
  // safetensors file; other tensors are not read. Accepts BF16 (copied) and F32 (rounded to
  // nearest even). FP8 checkpoints (DeepSeek's official ones, with weight_scale_inv) are
  // refused: dequantize them to BF16 first. Errors name the file and tensor: NOT_FOUND for a
  // missing file or layer, INVALID_ARGUMENT for a malformed file, a wrong shape or dtype.
  static absl::StatusOr<ModelWeights> FromSafetensors(const ModelConfig& config,
                                                      const std::string& path);

  // The checkpoint tensor holding layer `layer`'s up-projections.
  static std::string KvBProjTensorName(int layer);

  ModelWeights(ModelWeights&&) = default;
  ModelWeights& operator=(ModelWeights&&) = default;
  ModelWeights(const ModelWeights&) = delete;  // 2 GiB for DeepSeek-V3: never by accident
  ModelWeights& operator=(const ModelWeights&) = delete;

  const ModelConfig& config() const { return config_; }

  // Views of layer `layer` (0 <= layer < config().layers), valid while this object lives.
  UpProjection Layer(int layer) const;

  // Layer `layer`'s kv_b_proj matrix, [H * (Dn + Dv)][Dl] row-major.
  std::span<const Bf16> KvBProj(int layer) const;

  // Adds a second copy of every layer in the CPU matrix unit's tile layout: per head, W_UK
  // ([dn][dl]) then W_UV^T ([dl][dv]) packed by PackMatrixTiles (kernels/core/matmul.h), at the
  // offsets W_UK and W_UV have in kv_b_proj: both projections are then NN products. The emulated
  // NPUs' and the host's projections read that copy in place; the checkpoint layout stays for the
  // prefix expansions and for a GPU's upload. Costs bytes() again (33.5 MB a DeepSeek-V3 layer).
  // Call before the weights are shared.
  absl::Status AddMatrixTiles();
  // Layer `layer` in that layout; empty until AddMatrixTiles.
  std::span<const Bf16> KvBProjTiles(int layer) const;
  int64_t tile_bytes() const { return static_cast<int64_t>(tiles_.size()); }

  int64_t bytes() const { return static_cast<int64_t>(memory_.size()); }
  // Every layer at once, [layers][heads][dn + dv][dl] bf16: what a device copies.
  std::span<const std::byte> all_bytes() const {
    return {static_cast<const std::byte*>(memory_.data()), memory_.size()};
  }

 private:
  // Uninitialised (zero) storage for `config`'s weights.
  static absl::StatusOr<ModelWeights> Allocate(const ModelConfig& config);
  ModelWeights() = default;

  int64_t LayerElements() const;
  Bf16* data() const { return static_cast<Bf16*>(memory_.data()); }

  ModelConfig config_;
  AnonymousMapping memory_;  // [layers][heads][dn + dv][dl] bf16
  AnonymousMapping tiles_;   // the same in the matrix unit's layout, or empty
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_MODEL_MODEL_WEIGHTS_H_
