#include "kernels/core/vector_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "kernels/core/bfloat16.h"

namespace mlaserve {
namespace {
constexpr int kLanes = 64;  // fp32 elements per 256-byte vector repeat
}  // namespace

float RowMax(const float* x, int n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

float RowSum(const float* x, int n) {
  std::array<float, kLanes> lanes{};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[j + l];
  }
  for (int l = 0; j < n; ++j, ++l) lanes[l] += x[j];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

void ExpShifted(const float* x, int n, float shift, float* y) {
  if (shift == -std::numeric_limits<float>::infinity()) {
    std::fill_n(y, n, 0.0f);
    return;
  }
  for (int j = 0; j < n; ++j) y[j] = std::exp(x[j] - shift);
}

void ScaleToBf16(const float* x, int n, float factor, float* y) {
  for (int j = 0; j < n; ++j) y[j] = RoundToBf16(x[j] * factor);
}

void RoundToBf16InPlace(float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] = RoundToBf16(x[j]);
}

void WidenBf16(const Bf16* in, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = in[j].ToFloat();
}

}  // namespace mlaserve
