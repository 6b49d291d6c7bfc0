#include "kernels/mla/accuracy_protocol.h"

#include <cmath>
#include <numeric>

#include "common/status_macros.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/random_fill.h"
#include "kernels/reference/golden_attention.h"

namespace mlaserve {

std::vector<AccuracyCase> PaperAccuracyCases() {
  std::vector<AccuracyCase> cases;
  for (double sigma : {1.0, 2.0, 3.0, 4.0, 5.0, 10.0}) {
    cases.push_back({InputDistribution::kNormal, sigma});
  }
  for (double a : {1.0, 3.0, 5.0, 10.0, 20.0, 60.0}) {
    cases.push_back({InputDistribution::kUniform, a});
  }
  return cases;
}

std::string DistributionName(InputDistribution d) {
  return d == InputDistribution::kNormal ? "normal" : "uniform";
}

double RelativeFrobeniusError(std::span<const float> actual, std::span<const double> expected) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double a = RoundToBf16(actual[i]);  // kernels answer in bf16
    diff += (a - expected[i]) * (a - expected[i]);
    norm += expected[i] * expected[i];
  }
  return std::sqrt(diff) / (std::sqrt(norm) + 1e-10);
}

absl::StatusOr<std::vector<double>> MeasureAccuracy(const AccuracyCase& c, int seeds,
                                                    std::span<const NamedKernel> kernels,
                                                    const AccuracyShape& shape,
                                                    uint64_t base_seed) {
  if (seeds <= 0) return absl::InvalidArgumentError("seeds must be positive");
  if (shape.context % shape.page_size != 0) {
    return absl::InvalidArgumentError("context must be a whole number of pages");
  }
  std::vector<double> mean_error(kernels.size(), 0.0);
  const int pages = shape.context / shape.page_size;
  std::vector<Bf16> q(static_cast<size_t>(shape.rows) * shape.dk);
  std::vector<Bf16> kv(static_cast<size_t>(shape.context) * shape.dk);
  std::vector<int32_t> block_table(pages);
  std::iota(block_table.begin(), block_table.end(), 0);
  const std::vector<int32_t> seqlens{shape.context};

  for (int seed = 0; seed < seeds; ++seed) {
    Rng rng(base_seed + 1000003ull * seed + static_cast<uint64_t>(c.param * 1000.0) +
            (c.distribution == InputDistribution::kUniform ? 7777 : 0));
    if (c.distribution == InputDistribution::kNormal) {
      FillNormal(q, c.param, rng);
      FillNormal(kv, c.param, rng);
    } else {
      FillUniform(q, -c.param, c.param, rng);
      FillUniform(kv, -c.param, c.param, rng);
    }
    ASSIGN_OR_RETURN(auto q_view,
                     (TensorView<const Bf16, 4>::Create(q, {1, 1, shape.rows, shape.dk}, "q")));
    ASSIGN_OR_RETURN(auto pages_view, (TensorView<const Bf16, 3>::Create(
                                          kv, {pages, shape.page_size, shape.dk}, "kv")));
    ASSIGN_OR_RETURN(auto table_view, (TensorView<const int32_t, 2>::Create(block_table, {1, pages},
                                                                            "block_table")));
    const LatentDecodeProblem problem{
        q_view,
        PagedKvCache{pages_view},
        PagedSequences{table_view, seqlens},
        shape.dv,
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.dk))),
        /*causal=*/false};
    ASSIGN_OR_RETURN(GoldenOutput golden, GoldenLatentDecode(problem));
    for (size_t k = 0; k < kernels.size(); ++k) {
      ASSIGN_OR_RETURN(AttentionOutput result, kernels[k].run(problem));
      mean_error[k] += RelativeFrobeniusError(result.out, golden.out) / seeds;
    }
  }
  return mean_error;
}

}  // namespace mlaserve
