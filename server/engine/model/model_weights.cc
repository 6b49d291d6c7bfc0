#include "server/engine/model/model_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/core/matmul.h"
#include "kernels/core/tensor_view.h"
#include "server/engine/model/safetensors.h"

namespace mlaserve::engine {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// splitmix64's output function: a bijective mix good enough to turn a counter into 64
// independent-looking bits (Steele, Lea, Flood 2014).
constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Sum of the four 16-bit lanes of a random word, centred and scaled to unit variance
// (Irwin-Hall with n = 4: bounded by +-3.46 sigma, otherwise close to normal). Each lane has
// variance (2^32 - 1) / 12, the sum (2^32 - 1) / 3.
inline float ApproxNormal(uint64_t bits) {
  const auto lanes = static_cast<float>((bits & 0xffff) + ((bits >> 16) & 0xffff) +
                                        ((bits >> 32) & 0xffff) + (bits >> 48));
  constexpr float kMean = 4 * 32767.5f;
  constexpr float kInvSigma = 2.6429e-05f;  // 1 / sqrt((2^32 - 1) / 3) = 1 / 37837.23
  return (lanes - kMean) * kInvSigma;
}

// Runs body(begin, end) over [0, n) split evenly across up to 8 threads, the caller's among
// them: filling or packing gigabytes of weights at start is memory-bound, and a few threads
// saturate it.
template <typename Body>
void ParallelFor(int64_t n, Body body) {
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<std::thread> workers;
  for (int64_t t = 1; t < threads; ++t) {
    workers.emplace_back(body, n * t / threads, n * (t + 1) / threads);
  }
  body(0, n / threads);
  for (std::thread& w : workers) w.join();
}

absl::Status LayerNotFound(const std::string& path, int layer, int layers) {
  return absl::NotFoundError(absl::StrCat(
      "safetensors ", path, ": tensor '", ModelWeights::KvBProjTensorName(layer),
      "' is missing (layer ", layer, " of the ", layers, " the model config asks for)"));
}

}  // namespace

absl::StatusOr<ModelWeights> ModelWeights::Allocate(const ModelConfig& config) {
  ModelWeights weights;
  weights.config_ = config;
  ASSIGN_OR_RETURN(weights.memory_,
                   AnonymousMapping::Create(
                       static_cast<size_t>(weights.LayerElements()) * config.layers * sizeof(Bf16),
                       AnonymousMapping::Use::kDense));
  return weights;
}

int64_t ModelWeights::LayerElements() const {
  return static_cast<int64_t>(config_.heads) * (config_.dn + config_.dv) * config_.dl;
}

std::string ModelWeights::KvBProjTensorName(int layer) {
  return absl::StrCat("model.layers.", layer, ".self_attn.kv_b_proj.weight");
}

absl::StatusOr<ModelWeights> ModelWeights::FromSeed(const ModelConfig& config, uint64_t seed) {
  RETURN_IF_ERROR(config.Validate());
  ASSIGN_OR_RETURN(ModelWeights weights, Allocate(config));
  const float sigma = 1.0f / std::sqrt(static_cast<float>(config.dl));
  // Element i gets Mix64(key + (i + 1) * golden): splitmix64's i-th output for state `key`,
  // computed independently per element so the loop vectorises and splits across threads.
  const uint64_t key = Mix64(seed ^ 0x6d6c617365727665ull);  // "mlaserve"
  Bf16* out = weights.data();
  const auto fill = [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t bits = Mix64(key + static_cast<uint64_t>(i + 1) * kGolden);
      out[i] = Bf16::FromFloat(ApproxNormal(bits) * sigma);
    }
  };
  ParallelFor(weights.bytes() / static_cast<int64_t>(sizeof(Bf16)), fill);
  return weights;
}

absl::StatusOr<ModelWeights> ModelWeights::FromSafetensors(const ModelConfig& config,
                                                           const std::string& path) {
  RETURN_IF_ERROR(config.Validate());
  ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::Open(path));
  // Check every layer before allocating: a wrong file should fail fast, not after 2 GiB.
  const std::vector<int64_t> expected_shape = {
      static_cast<int64_t>(config.heads) * (config.dn + config.dv), config.dl};
  std::vector<const SafetensorsTensorInfo*> tensors(config.layers);
  for (int layer = 0; layer < config.layers; ++layer) {
    const std::string name = KvBProjTensorName(layer);
    const SafetensorsTensorInfo* t = file.Find(name);
    if (t == nullptr) return LayerNotFound(path, layer, config.layers);
    if (t->dtype.starts_with("F8_")) {
      const bool scaled =
          file.Find(absl::StrCat("model.layers.", layer,
                                 ".self_attn.kv_b_proj.weight_scale_inv")) != nullptr;
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors ", path, ": tensor '", name, "' is FP8 (", t->dtype, ")",
          scaled ? " with a block-scale tensor weight_scale_inv" : "",
          ", as in the official DeepSeek checkpoints; dequantize kv_b_proj to BF16 first "
          "(e.g. DeepSeek's fp8_cast_bf16.py): only BF16 and F32 are accepted"));
    }
    if (t->dtype != "BF16" && t->dtype != "F32") {
      return absl::InvalidArgumentError(absl::StrCat("safetensors ", path, ": tensor '", name,
                                                     "' has dtype ", t->dtype,
                                                     "; only BF16 and F32 are accepted"));
    }
    if (t->shape != expected_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors ", path, ": tensor '", name, "' has shape [", absl::StrJoin(t->shape, ", "),
          "] but ", config.name, " needs [heads * (dn + dv), dl] = [",
          absl::StrJoin(expected_shape, ", "), "]"));
    }
    tensors[layer] = t;
  }

  ASSIGN_OR_RETURN(ModelWeights weights, Allocate(config));
  for (int layer = 0; layer < config.layers; ++layer) {
    const std::span<const std::byte> bytes = file.Data(*tensors[layer]);
    Bf16* out = weights.data() + layer * weights.LayerElements();
    if (tensors[layer]->dtype == "BF16") {
      std::memcpy(out, bytes.data(), bytes.size());
    } else {
      // No alignment is promised inside the data section: read each float through memcpy.
      for (int64_t i = 0; i < weights.LayerElements(); ++i) {
        float value;
        std::memcpy(&value, bytes.data() + i * sizeof(float), sizeof(float));
        out[i] = Bf16::FromFloat(value);
      }
    }
  }
  return weights;
}

UpProjection ModelWeights::Layer(int layer) const {
  const int row = config_.dn + config_.dv;
  const Bf16* base = data() + layer * LayerElements();
  const int64_t capacity = LayerElements();
  const std::array<int64_t, 3> strides = {static_cast<int64_t>(row) * config_.dl, config_.dl, 1};
  // Shapes are consistent with the storage by construction, so the views cannot fail.
  return UpProjection{
      *TensorView<const Bf16, 3>::CreateStrided(
          base, capacity, {config_.heads, config_.dn, config_.dl}, strides, "w_uk"),
      *TensorView<const Bf16, 3>::CreateStrided(
          base + static_cast<int64_t>(config_.dn) * config_.dl,
          capacity - static_cast<int64_t>(config_.dn) * config_.dl,
          {config_.heads, config_.dv, config_.dl}, strides, "w_uv"),
  };
}

std::span<const Bf16> ModelWeights::KvBProj(int layer) const {
  return {data() + layer * LayerElements(), static_cast<size_t>(LayerElements())};
}

absl::Status ModelWeights::AddMatrixTiles() {
  if (tiles_.size() > 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(tiles_, AnonymousMapping::Create(memory_.size(), AnonymousMapping::Use::kDense));
  Bf16* out = static_cast<Bf16*>(tiles_.data());
  const int dl = config_.dl;
  // Each head's W_UK ([dn][dl]) and W_UV^T ([dl][dv]) packed where W_UK and W_UV lie.
  const int64_t matrices = static_cast<int64_t>(config_.layers) * config_.heads * 2;
  const auto pack = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t head = i / 2;
      const bool uv = i % 2 == 1;
      const int rows = uv ? config_.dv : config_.dn;
      const int64_t offset =
          head * (config_.dn + config_.dv) * dl + (uv ? int64_t{config_.dn} * dl : 0);
      (uv ? PackMatrixTilesTransposed : PackMatrixTiles)(data() + offset, dl, rows, dl,
                                                         out + offset);
    }
  };
  ParallelFor(matrices, pack);
  return absl::OkStatus();
}

std::span<const Bf16> ModelWeights::KvBProjTiles(int layer) const {
  if (tiles_.size() == 0) return {};
  return {static_cast<const Bf16*>(tiles_.data()) + layer * LayerElements(),
          static_cast<size_t>(LayerElements())};
}

}  // namespace mlaserve::engine
