// The soak's answer check against attention written out here in fp64 (the textbook formula,
// independent of the reference kernel the check uses): right answers pass, and the faults a
// server could make (a wrong element, a missing appended row, no causal mask, a wrong LSE)
// fail.

#include "client/loadgen/soak_check.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/random_fill.h"

namespace mlaserve::loadgen {
namespace {

constexpr int kHeads = 4, kDk = 40, kDl = 32;
constexpr double kScale = 0.15;

struct Answer {
  std::vector<float> out, lse;
};

// o = softmax(scale q k^T) v over the first `visible` keys, v = k[:, :dl]; the output as the
// server sends it (rounded to bf16), the LSE as fp32.
Answer Textbook(const std::vector<Bf16>& q, int sq, const std::vector<Bf16>& keys, bool causal) {
  const int n = static_cast<int>(keys.size()) / kDk;
  Answer a;
  for (int s = 0; s < sq; ++s) {
    const int visible = causal ? n - sq + s + 1 : n;
    for (int h = 0; h < kHeads; ++h) {
      const Bf16* qr = &q[(static_cast<size_t>(s) * kHeads + h) * kDk];
      std::vector<double> score(visible);
      double m = -INFINITY;
      for (int t = 0; t < visible; ++t) {
        double dot = 0;
        for (int d = 0; d < kDk; ++d) dot += double{qr[d].ToFloat()} * keys[t * kDk + d].ToFloat();
        score[t] = kScale * dot;
        m = std::max(m, score[t]);
      }
      double sum = 0;
      for (double& x : score) sum += (x = std::exp(x - m));
      for (int d = 0; d < kDl; ++d) {
        double o = 0;
        for (int t = 0; t < visible; ++t) o += score[t] / sum * keys[t * kDk + d].ToFloat();
        a.out.push_back(Bf16::FromFloat(static_cast<float>(o)).ToFloat());
      }
      a.lse.push_back(static_cast<float>(m + std::log(sum)));
    }
  }
  return a;
}

std::vector<Bf16> Random(size_t n, Rng& rng) {
  std::vector<Bf16> v(n);
  FillNormal(v, 1.0, rng);
  return v;
}

AnswerCheck Check(const std::vector<Bf16>& q, int sq, const std::vector<Bf16>& keys,
                  const Answer& a) {
  return CheckLatentAnswer(q, sq, kHeads, kDk, kDl, keys, kScale, a.out, a.lse);
}

TEST(SoakCheckTest, RightAnswersPassWithinTheirBounds) {
  Rng rng(5);
  for (int sq : {1, 2}) {
    const std::vector<Bf16> q = Random(static_cast<size_t>(sq) * kHeads * kDk, rng);
    const std::vector<Bf16> keys = Random(static_cast<size_t>(300) * kDk, rng);
    const AnswerCheck c = Check(q, sq, keys, Textbook(q, sq, keys, true));
    EXPECT_TRUE(c.ok) << c.why;
    EXPECT_LT(c.worst_bound_ratio, 1);
    EXPECT_LT(c.cos_diff, kSoakOutTolerance.cos_tol);
    // The only error left is the output's bf16 rounding: at most half an ulp, 2^-9 relative.
    EXPECT_LT(c.max_abs_out, 1.0 / 256);
  }
}

TEST(SoakCheckTest, OneElementBeyondItsBoundFails) {
  Rng rng(6);
  const std::vector<Bf16> q = Random(kHeads * kDk, rng);
  const std::vector<Bf16> keys = Random(static_cast<size_t>(50) * kDk, rng);
  Answer a = Textbook(q, 1, keys, true);
  a.out[17] += 0.05f;  // over 8e-3 absolute, and over 2.01/128 of any |o| below 3
  const AnswerCheck c = Check(q, 1, keys, a);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.why.find("out[17]"), std::string::npos) << c.why;
  EXPECT_GE(c.worst_bound_ratio, 1);
}

TEST(SoakCheckTest, AnswerMissingTheAppendedRowFails) {
  Rng rng(7);
  const std::vector<Bf16> q = Random(kHeads * kDk, rng);
  const std::vector<Bf16> keys = Random(static_cast<size_t>(40) * kDk, rng);
  const std::vector<Bf16> without_last(keys.begin(), keys.end() - kDk);
  EXPECT_FALSE(Check(q, 1, keys, Textbook(q, 1, without_last, true)).ok);
}

TEST(SoakCheckTest, MtpWithoutTheCausalMaskFails) {
  Rng rng(8);
  const std::vector<Bf16> q = Random(2 * kHeads * kDk, rng);
  const std::vector<Bf16> keys = Random(static_cast<size_t>(20) * kDk, rng);
  EXPECT_FALSE(Check(q, 2, keys, Textbook(q, 2, keys, false)).ok);
}

TEST(SoakCheckTest, WrongLseFailsAndWrongShapeFails) {
  Rng rng(9);
  const std::vector<Bf16> q = Random(kHeads * kDk, rng);
  const std::vector<Bf16> keys = Random(static_cast<size_t>(60) * kDk, rng);
  Answer a = Textbook(q, 1, keys, true);
  a.lse[2] += 0.01f;  // LSE ~ 4: 2.5e-3 relative, over 8.01/65536
  AnswerCheck c = Check(q, 1, keys, a);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.why.find("lse[2]"), std::string::npos) << c.why;
  a = Textbook(q, 1, keys, true);
  a.out.pop_back();
  c = Check(q, 1, keys, a);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.why.find("shape"), std::string::npos) << c.why;
}

}  // namespace
}  // namespace mlaserve::loadgen
