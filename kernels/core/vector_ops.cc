#include "kernels/core/vector_ops.h"

#include <algorithm>
#include <array>
#include <bit>
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

namespace {

// SLEEF's exp (1.0 ulp), the widest vector the build targets.
#if defined(__AVX512F__)
struct ExpVector {
  static constexpr int kWidth = 16;
  static __m512 Shifted(const float* x, __m512 shift) {
    return Sleef_expf16_u10(_mm512_sub_ps(_mm512_loadu_ps(x), shift));
  }
  static __m512 Splat(float v) { return _mm512_set1_ps(v); }
  static void Store(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
};
#elif defined(__AVX2__)
struct ExpVector {
  static constexpr int kWidth = 8;
  static __m256 Shifted(const float* x, __m256 shift) {
    return Sleef_expf8_u10(_mm256_sub_ps(_mm256_loadu_ps(x), shift));
  }
  static __m256 Splat(float v) { return _mm256_set1_ps(v); }
  static void Store(float* y, __m256 v) { _mm256_storeu_ps(y, v); }
};
#endif

}  // namespace

void ExpShifted(const float* x, int n, float shift, float* y) {
  if (shift == -std::numeric_limits<float>::infinity()) {
    std::fill_n(y, n, 0.0f);
    return;
  }
#if defined(__AVX512F__) || defined(__AVX2__)
  constexpr int kWidth = ExpVector::kWidth;
  const auto s = ExpVector::Splat(shift);
  int j = 0;
  for (; j + kWidth <= n; j += kWidth) ExpVector::Store(y + j, ExpVector::Shifted(x + j, s));
  if (j < n) {  // the tail through a padded vector: every element takes the same function
    std::array<float, kWidth> tail;
    tail.fill(shift);
    std::copy(x + j, x + n, tail.begin());
    ExpVector::Store(tail.data(), ExpVector::Shifted(tail.data(), s));
    std::copy_n(tail.begin(), n - j, y + j);
  }
#else
  for (int j = 0; j < n; ++j) y[j] = Sleef_expf_u10(x[j] - shift);
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

void NarrowToBf16(const float* in, int64_t n, Bf16* out) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t u = std::bit_cast<uint32_t>(in[j]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;
    out[j] = Bf16{static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
  }
}

}  // namespace mlaserve
