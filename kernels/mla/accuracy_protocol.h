#ifndef MLASERVE_KERNELS_MLA_ACCURACY_PROTOCOL_H_
#define MLASERVE_KERNELS_MLA_ACCURACY_PROTOCOL_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/core/latent_decode.h"

namespace mlaserve {

// The AMLA paper's accuracy protocol (§5.1; docs/numerics.md, "AMLA accuracy sweep"): G = 128 query
// rows, Dk = 576, Dv = 512 (V = first 512 columns of K), context 8192, bf16 inputs, scale
// 1/sqrt(576); Q and K drawn from N(0, sigma^2) or U(-a, a); error = relative Frobenius norm of the
// kernel's bf16 output against the fp64 golden output.

enum class InputDistribution { kNormal, kUniform };

struct AccuracyCase {
  InputDistribution distribution;
  double param;  // sigma for normal, a for uniform
};

// The twelve cases of the paper's Tables 3 and 4.
std::vector<AccuracyCase> PaperAccuracyCases();

std::string DistributionName(InputDistribution d);

// A kernel under test: returns fp32 outputs for the problem (cast to bf16 by the protocol).
struct NamedKernel {
  std::string name;
  std::function<absl::StatusOr<AttentionOutput>(const LatentDecodeProblem&)> run;
};

struct AccuracyShape {
  int rows = 128;
  int dk = 576;
  int dv = 512;
  int context = 8192;
  int page_size = 128;
};

// ||A - B||_F / (||B||_F + 1e-10), the paper's metric.
double RelativeFrobeniusError(std::span<const float> actual, std::span<const double> expected);

// Mean error of each kernel (in the order given) over `seeds` draws of one case.
absl::StatusOr<std::vector<double>> MeasureAccuracy(const AccuracyCase& c, int seeds,
                                                    std::span<const NamedKernel> kernels,
                                                    const AccuracyShape& shape = {},
                                                    uint64_t base_seed = 2025);

}  // namespace mlaserve

#endif  // MLASERVE_KERNELS_MLA_ACCURACY_PROTOCOL_H_
