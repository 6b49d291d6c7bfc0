#include "kernels/core/vector_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <immintrin.h>
#include <sleef.h>

#include "kernels/core/bfloat16.h"

namespace mlaserve {
namespace {
constexpr int kLanes = 64;  // fp32 elements per 256-byte vector repeat
}  // namespace

float RowMax(const float* x, int n) {
  // Lane-wise maxima first (the compiler turns them into vector max instructions; a single
  // running max is a serial dependency it may not reorder), then their maximum: the same
  // value, max being exact and order-free.
  std::array<float, kLanes> lanes;
  lanes.fill(-std::numeric_limits<float>::infinity());
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = lanes[l] < x[j + l] ? x[j + l] : lanes[l];
  }
  for (int l = 0; j < n; ++j, ++l) lanes[l] = lanes[l] < x[j] ? x[j] : lanes[l];
  float m = lanes[0];
  for (int l = 1; l < kLanes; ++l) m = m < lanes[l] ? lanes[l] : m;
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
  // SLEEF's exp (1.0 ulp), a vector at a time; the tail goes through a padded vector, so
  // every element gets the same function whatever its position.
#if defined(__AVX512F__)
  using Vec = __m512;
  constexpr int kWidth = 16;
  auto load = [](const float* p) { return _mm512_loadu_ps(p); };
  auto store = [](float* p, Vec v) { _mm512_storeu_ps(p, v); };
  auto sub = [](Vec a, Vec b) { return _mm512_sub_ps(a, b); };
  auto set1 = [](float v) { return _mm512_set1_ps(v); };
  auto exp = [](Vec v) { return Sleef_expf16_u10(v); };
#elif defined(__AVX2__)
  using Vec = __m256;
  constexpr int kWidth = 8;
  auto load = [](const float* p) { return _mm256_loadu_ps(p); };
  auto store = [](float* p, Vec v) { _mm256_storeu_ps(p, v); };
  auto sub = [](Vec a, Vec b) { return _mm256_sub_ps(a, b); };
  auto set1 = [](float v) { return _mm256_set1_ps(v); };
  auto exp = [](Vec v) { return Sleef_expf8_u10(v); };
#else
  for (int j = 0; j < n; ++j) y[j] = Sleef_expf_u10(x[j] - shift);
  return;
#endif
#if defined(__AVX2__) || defined(__AVX512F__)
  const Vec s = set1(shift);
  int j = 0;
  for (; j + kWidth <= n; j += kWidth) store(y + j, exp(sub(load(x + j), s)));
  if (j < n) {
    alignas(64) std::array<float, kWidth> tail;
    tail.fill(shift);
    std::copy(x + j, x + n, tail.begin());
    store(tail.data(), exp(sub(load(tail.data()), s)));
    std::copy_n(tail.begin(), n - j, y + j);
  }
#endif
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
