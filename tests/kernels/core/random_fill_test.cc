#include "kernels/core/random_fill.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve {
namespace {

// The samplers stand in for the std:: distributions, so every seeded data set (the tests'
// fixed seeds, the demos', the model's seeded weights) stays what it was: value for value the
// same sequence, over enough draws to pass through rejected polar points and saved pairs.
#if defined(__GLIBCXX__)
TEST(RandomFillTest, NormalSamplerDrawsStdNormalDistributionsSequence) {
  Rng ours(std::random_device{}());
  Rng theirs = ours;
  NormalSampler<double> normal(0.5, 3.0);
  std::normal_distribution<double> reference(0.5, 3.0);
  for (int i = 0; i < 100000; ++i) ASSERT_EQ(normal(ours), reference(theirs)) << "draw " << i;
}

TEST(RandomFillTest, FloatNormalSamplerDrawsStdNormalDistributionsSequence) {
  Rng ours(std::random_device{}());
  Rng theirs = ours;
  NormalSampler<float> normal(0.0f, 6.0f);
  std::normal_distribution<float> reference(0.0f, 6.0f);
  for (int i = 0; i < 100000; ++i) ASSERT_EQ(normal(ours), reference(theirs)) << "draw " << i;
}

TEST(RandomFillTest, UniformRealDrawsStdUniformRealDistributionsSequence) {
  Rng ours(std::random_device{}());
  Rng theirs = ours;
  std::uniform_real_distribution<double> reference(-12.0, 4.0);
  std::uniform_real_distribution<float> reference_float(-10.0f, 9.0f);
  for (int i = 0; i < 100000; ++i) {
    ASSERT_EQ(UniformReal(-12.0, 4.0, ours), reference(theirs)) << "draw " << i;
    ASSERT_EQ(UniformReal(-10.0f, 9.0f, ours), reference_float(theirs)) << "draw " << i;
  }
}
#endif

// Draws that round up to 2^64 (the top 2^10 values of a 64-bit draw in double) stay below 1,
// as generate_canonical's are.
TEST(RandomFillTest, CanonicalRealStaysBelowOne) {
  struct TopOfRange {
    using result_type = uint64_t;
    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return ~uint64_t{0}; }
    result_type operator()() { return max(); }
  } top;
  EXPECT_LT(CanonicalReal<double>(top), 1.0);
  EXPECT_LT(CanonicalReal<float>(top), 1.0f);
  EXPECT_GE(CanonicalReal<double>(top), 0.999);
}

TEST(RandomFillTest, FillNormalHasTheRequestedSpread) {
  Rng rng(std::random_device{}());
  std::vector<Bf16> values(200000);
  FillNormal(values, 2.0, rng);
  double sum = 0, sum_sq = 0;
  for (Bf16 v : values) {
    sum += v.ToFloat();
    sum_sq += double{v.ToFloat()} * v.ToFloat();
  }
  const double mean = sum / values.size();
  // Standard errors: 2 / sqrt(n) = 0.0045 for the mean, about 0.006 for the sigma.
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(sum_sq / values.size() - mean * mean), 2.0, 0.04);
}

}  // namespace
}  // namespace mlaserve
