#ifndef MLASERVE_KERNELS_CORE_RANDOM_FILL_H_
#define MLASERVE_KERNELS_CORE_RANDOM_FILL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <span>

#include "kernels/core/bfloat16.h"

namespace mlaserve {

// Seeded test and demo data. std::mt19937_64 with std:: distributions' sequences:
// reproducible for a given seed on one standard library, which is all tests, demos and sweeps
// need.
using Rng = std::mt19937_64;

// std::generate_canonical<Real>(rng) for a full-range 64-bit generator such as Rng, value for value
// as libstdc++ computes it (one 64-bit draw rounded to Real, over 2^64, kept below 1). libstdc++
// recomputes the log2 of the generator's range in long double on every call; gcc folds that away,
// clang does not, so under clang's sanitizers the std:: distributions cost about 7 times their gcc
// time, and random test data was most of the heaviest sanitizer tests' run time.
template <typename Real, typename Generator>
Real CanonicalReal(Generator& rng) {
  static_assert(Generator::min() == 0 && Generator::max() == ~uint64_t{0});
  const Real value = static_cast<Real>(rng()) * static_cast<Real>(0x1.0p-64);
  return value < Real{1} ? value : std::nextafter(Real{1}, Real{0});
}

// std::normal_distribution<Real>(mean, sigma)'s sequence (libstdc++'s Marsaglia polar method,
// a pair per accepted point, the second kept for the next call), over CanonicalReal. The same
// seed gives the same values as the std:: distribution; normal_sampler_test holds it to that.
template <typename Real>
class NormalSampler {
 public:
  explicit NormalSampler(Real mean = 0, Real sigma = 1) : mean_(mean), sigma_(sigma) {}

  Real operator()(Rng& rng) {
    Real unit;
    if (saved_available_) {
      saved_available_ = false;
      unit = saved_;
    } else {
      Real x, y, r2;
      do {
        x = Real{2} * CanonicalReal<Real>(rng) - Real{1};
        y = Real{2} * CanonicalReal<Real>(rng) - Real{1};
        r2 = x * x + y * y;
      } while (r2 > Real{1} || r2 == Real{0});
      const Real mult = std::sqrt(Real{-2} * std::log(r2) / r2);
      saved_ = x * mult;
      saved_available_ = true;
      unit = y * mult;
    }
    return unit * sigma_ + mean_;
  }

 private:
  Real mean_;
  Real sigma_;
  Real saved_ = 0;
  bool saved_available_ = false;
};

// std::uniform_real_distribution<Real>(lo, hi)'s sequence over CanonicalReal.
template <typename Real>
Real UniformReal(Real lo, Real hi, Rng& rng) {
  return CanonicalReal<Real>(rng) * (hi - lo) + lo;
}

inline void FillNormal(std::span<Bf16> out, double sigma, Rng& rng) {
  NormalSampler<double> normal(0.0, sigma);
  for (Bf16& x : out) x = Bf16::FromFloat(static_cast<float>(normal(rng)));
}

inline void FillUniform(std::span<Bf16> out, double lo, double hi, Rng& rng) {
  for (Bf16& x : out) x = Bf16::FromFloat(static_cast<float>(UniformReal(lo, hi, rng)));
}

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_RANDOM_FILL_H_
