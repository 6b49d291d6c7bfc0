#include "bench/accuracy_command.h"

#include <chrono>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/host_description.h"
#include "common/status_macros.h"
#include "kernels/mla/accuracy_protocol.h"
#include "kernels/mla/amla.h"
#include "kernels/mla/flash_base.h"
#include "nlohmann/json.hpp"

namespace mlaserve::bench {
namespace {

NamedKernel AmlaWith(std::string name, AmlaCompensation compensation) {
  return {std::move(name), [compensation](const LatentDecodeProblem& p) {
            return AmlaDecode(p, AmlaOptions{compensation});
          }};
}

}  // namespace

absl::Status RunAccuracyCommand(const AccuracyCommandOptions& options, std::ostream& out) {
  const std::vector<NamedKernel> kernels = {
      {"base", FlashBaseDecode},
      AmlaWith("amla", AmlaCompensation::kDerived),
      AmlaWith("amla_listing", AmlaCompensation::kAlgorithm2Listing),
      AmlaWith("amla_uncompensated", AmlaCompensation::kNone),
  };
  const AccuracyShape shape;
  const auto start = std::chrono::steady_clock::now();
  if (!options.json) {
    out << absl::StrFormat(
        "AMLA accuracy sweep: G=%d Dk=%d Dv=%d context=%d, bf16 inputs, scale=1/sqrt(%d), "
        "%d seed(s) per distribution\n%s\n"
        "error = ||out_bf16 - golden_fp64||_F / ||golden||_F, mean over seeds\n\n",
        shape.rows, shape.dk, shape.dv, shape.context, shape.dk, options.seeds, HostDescription());
    out << absl::StrFormat("%-8s %6s  %12s %12s %9s  %14s %14s\n", "dist", "param", "base_err",
                           "amla_err", "amla/base", "listing_err", "uncomp_err");
  }
  for (const AccuracyCase& c : PaperAccuracyCases()) {
    ASSIGN_OR_RETURN(std::vector<double> err, MeasureAccuracy(c, options.seeds, kernels, shape));
    if (options.json) {
      nlohmann::json row = {{"dist", DistributionName(c.distribution)},
                            {"param", c.param},
                            {"seeds", options.seeds},
                            {"base_err", err[0]},
                            {"amla_err", err[1]},
                            {"amla_listing_err", err[2]},
                            {"amla_uncompensated_err", err[3]}};
      out << row.dump() << "\n";
    } else {
      out << absl::StrFormat("%-8s %6g  %12.4e %12.4e %9.4f  %14.4e %14.4e\n",
                             DistributionName(c.distribution), c.param, err[0], err[1],
                             err[0] > 0 ? err[1] / err[0] : 0.0, err[2], err[3]);
    }
    out.flush();
  }
  if (!options.json) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out << absl::StrFormat(
        "\nlisting = AMLA with Algorithm 2's printed ratio c_i/c_{i-1}; uncomp = no mantissa "
        "correction.\nelapsed %.1f s\n",
        seconds);
  }
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
