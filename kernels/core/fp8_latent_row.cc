#include "kernels/core/fp8_latent_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mlaserve {
namespace {

constexpr float kRopeHeadroom = 0x1p120f;  // bf16 holds up to ~2^128; keep a margin

inline float ToFloat(float x) { return x; }
inline float ToFloat(Bf16 x) { return x.ToFloat(); }

template <typename T>
void Quantize(const T* row, int dl, int dr, Fp8LatentRow out) {
  float content_amax = 0.0f;
  for (int j = 0; j < dl; ++j) content_amax = std::max(content_amax, std::fabs(ToFloat(row[j])));
  float rope_amax = 0.0f;
  for (int j = dl; j < dl + dr; ++j) rope_amax = std::max(rope_amax, std::fabs(ToFloat(row[j])));
  float scale = std::max(content_amax, kFp8AmaxFloor) / Fp8E4m3::kMax;
  scale = std::max(scale, rope_amax / kRopeHeadroom);
  *out.scale = scale;
  for (int j = 0; j < dl; ++j) out.content[j] = Fp8E4m3::FromFloat(ToFloat(row[j]) / scale);
  for (int j = 0; j < dr; ++j) out.rope[j] = Bf16::FromFloat(ToFloat(row[dl + j]) / scale);
}

}  // namespace

void QuantizeLatentRow(const float* row, int dl, int dr, Fp8LatentRow out) {
  Quantize(row, dl, dr, out);
}

void QuantizeLatentRow(const Bf16* row, int dl, int dr, Fp8LatentRow out) {
  Quantize(row, dl, dr, out);
}

void QuantizeLatentRowToRecord(const Bf16* row, int dl, int dr, std::byte* record) {
  float scale = 0;
  QuantizeLatentRow(row, dl, dr,
                    Fp8LatentRow{reinterpret_cast<Fp8E4m3*>(record), &scale,
                                 reinterpret_cast<Bf16*>(record + dl + sizeof(float))});
  std::memcpy(record + dl, &scale, sizeof scale);
}

void DequantizeLatentRow(const Fp8E4m3* content, float scale, const Bf16* rope, int dl, int dr,
                         float* row) {
  for (int j = 0; j < dl; ++j) row[j] = content[j].ToFloat() * scale;
  for (int j = 0; j < dr; ++j) row[dl + j] = rope[j].ToFloat() * scale;
}

}  // namespace mlaserve
