#include "kernels/core/fp8_latent_row.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/random_fill.h"
#include "tests/testing/latent_dims.h"

namespace mlaserve {
namespace {

using testing::kDl;
using testing::kDr;

struct Quantized {
  std::vector<Fp8E4m3> content = std::vector<Fp8E4m3>(kDl);
  float scale = 0;
  std::vector<Bf16> rope = std::vector<Bf16>(kDr);
};

Quantized Quantize(const std::vector<Bf16>& row) {
  Quantized q;
  QuantizeLatentRow(row.data(), kDl, kDr, Fp8LatentRow{q.content.data(), &q.scale, q.rope.data()});
  return q;
}

TEST(Fp8LatentRowTest, ScaleMapsTheContentMaximumToTheLargestCode) {
  Rng rng(std::random_device{}());
  std::vector<Bf16> row(kDl + kDr);
  FillNormal(row, 3.0, rng);
  double amax = 0;
  for (int c = 0; c < kDl; ++c) amax = std::max(amax, std::fabs(double{row[c].ToFloat()}));
  const Quantized q = Quantize(row);
  EXPECT_NEAR(q.scale, amax / 448.0, amax / 448.0 * 1e-6);
  int at_max = 0;
  for (const Fp8E4m3 v : q.content) at_max += std::fabs(v.ToFloat()) == 448.0f;
  EXPECT_GE(at_max, 1);
}

TEST(Fp8LatentRowTest, ContentIsTheNearestCodeAndRopeTheNearestBf16InTheScaledDomain) {
  Rng rng(std::random_device{}());
  std::vector<Bf16> row(kDl + kDr);
  FillNormal(row, 0.5, rng);
  const Quantized q = Quantize(row);
  for (int c = 0; c < kDl; ++c) {
    // The formula divides in fp32; the code is the nearest to that quotient.
    const double x = row[c].ToFloat() / q.scale;
    const double got = q.content[c].ToFloat();
    // No other code is nearer: the neighbours on either side are at least as far.
    const Fp8E4m3 up = Fp8E4m3::FromBits(static_cast<uint8_t>(q.content[c].bits + 1));
    const Fp8E4m3 down = Fp8E4m3::FromBits(static_cast<uint8_t>(q.content[c].bits - 1));
    if ((q.content[c].bits & 0x7f) < 0x7e) {
      EXPECT_LE(std::fabs(got - x), std::fabs(up.ToFloat() - x) + 1e-12) << c;
    }
    if ((q.content[c].bits & 0x7f) > 0) {
      EXPECT_LE(std::fabs(got - x), std::fabs(down.ToFloat() - x) + 1e-12) << c;
    }
    // e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 relative for normal codes.
    if (std::fabs(x) >= 0x1p-6) {
      EXPECT_LE(std::fabs(got - x), std::fabs(x) * 0x1p-4 * 1.0001) << c;
    }
  }
  for (int c = 0; c < kDr; ++c) {
    const double x = row[kDl + c].ToFloat() / q.scale;
    EXPECT_LE(std::fabs(q.rope[c].ToFloat() - x), std::fabs(x) * 0x1p-8 * 1.0001) << c;
  }
  std::vector<float> back(kDl + kDr);
  DequantizeLatentRow(q.content.data(), q.scale, q.rope.data(), kDl, kDr, back.data());
  for (int c = kDl; c < kDl + kDr; ++c) {
    EXPECT_NEAR(back[c], row[c].ToFloat(), std::fabs(row[c].ToFloat()) * 0x1p-7) << c;
  }
}

TEST(Fp8LatentRowTest, ZeroContentTakesTheFloorAndHugeRopeStaysFinite) {
  std::vector<Bf16> row(kDl + kDr, Bf16::FromFloat(0.0f));
  Quantized q = Quantize(row);
  EXPECT_EQ(q.scale, kFp8AmaxFloor / 448.0f);
  for (const Fp8E4m3 v : q.content) EXPECT_EQ(v.ToFloat(), 0.0f);

  row[kDl + 3] = Bf16::FromFloat(1e30f);  // RoPE beside an all-zero content
  q = Quantize(row);
  EXPECT_GE(q.scale, 1e30f / 0x1p120f);
  for (const Bf16 v : q.rope) EXPECT_TRUE(v.IsFinite());
  EXPECT_NEAR(q.rope[3].ToFloat() * q.scale, 1e30, 1e30 * 0x1p-7);
}

TEST(Fp8LatentRowTest, FloatAndBf16InputsGiveTheSameBytes) {
  Rng rng(std::random_device{}());
  std::vector<Bf16> row(kDl + kDr);
  FillNormal(row, 1.0, rng);
  std::vector<float> widened(row.size());
  for (size_t i = 0; i < row.size(); ++i) widened[i] = row[i].ToFloat();
  const Quantized a = Quantize(row);
  Quantized b;
  QuantizeLatentRow(widened.data(), kDl, kDr,
                    Fp8LatentRow{b.content.data(), &b.scale, b.rope.data()});
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.rope, b.rope);
}

}  // namespace
}  // namespace mlaserve
