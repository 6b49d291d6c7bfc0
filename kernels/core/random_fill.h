#ifndef MLASERVE_KERNELS_CORE_RANDOM_FILL_H_
#define MLASERVE_KERNELS_CORE_RANDOM_FILL_H_

#include <cstdint>
#include <random>
#include <span>

#include "kernels/core/bfloat16.h"

namespace mlaserve {

// Seeded test and demo data. std::mt19937_64 with std:: distributions: reproducible for a
// given seed on one standard library, which is all tests, demos and sweeps need.
using Rng = std::mt19937_64;

inline void FillNormal(std::span<Bf16> out, double sigma, Rng& rng) {
  std::normal_distribution<double> dist(0.0, sigma);
  for (Bf16& x : out) x = Bf16::FromFloat(static_cast<float>(dist(rng)));
}

inline void FillUniform(std::span<Bf16> out, double lo, double hi, Rng& rng) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (Bf16& x : out) x = Bf16::FromFloat(static_cast<float>(dist(rng)));
}

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_CORE_RANDOM_FILL_H_
