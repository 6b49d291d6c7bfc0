#ifndef MLASERVE_CLIENT_LOADGEN_TRAFFIC_MODEL_H_
#define MLASERVE_CLIENT_LOADGEN_TRAFFIC_MODEL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mlaserve::loadgen {

using TrafficRng = std::mt19937_64;

// A distribution of token counts (context lengths, decode steps), parsed from a flag:
//   fixed:N              always N
//   uniform:A,B          every integer in [A, B] equally likely
//   lognormal:MEDIAN,S   exp(N(ln MEDIAN, S^2)), rounded, at least 1 (long-tailed, as
//                        production prompt lengths are)
//   file:PATH            one length per line (blank lines and # comments skipped), each line
//                        equally likely: a trace of real lengths
// Every draw is in [1, max] (max from the flag that owns it), so one huge draw cannot take
// the run past the server's limits: a log-normal's tail is clamped to max, while uniform
// bounds and file lengths above it are refused (clamping them would pile draws on max).
class LengthDistribution {
 public:
  // INVALID_ARGUMENT naming `flag` for a malformed spec, a value below 1, A > B, S < 0, an
  // unreadable or empty file, or a minimum above `max`.
  static absl::StatusOr<LengthDistribution> Parse(absl::string_view spec, absl::string_view flag,
                                                  int max);

  int Draw(TrafficRng& rng) const;
  // The spec it was parsed from, for reports.
  const std::string& spec() const { return spec_; }
  // The largest draw possible.
  int max() const { return max_; }

 private:
  enum class Kind { kFixed, kUniform, kLogNormal, kFile };
  Kind kind_ = Kind::kFixed;
  int a_ = 1, b_ = 1;  // fixed: a; uniform: [a, b]
  double median_ = 1, sigma_ = 0;
  std::vector<int> lengths_;  // file
  int max_ = 1;
  std::string spec_;
};

// Arrival times of new sequences: a renewal process whose gaps are Gamma(k, 1 / (rate k)), so
// the mean rate is `rate` for any k; k = 1 is Poisson (exponential gaps), k < 1 burstier, k > 1
// more regular (vLLM's benchmark_serving `--burstiness`). rate 0: no arrival process (a closed
// population, topped up as sequences finish).
class ArrivalProcess {
 public:
  // INVALID_ARGUMENT naming --arrival-rate (negative, not finite) or --burstiness (not > 0).
  static absl::StatusOr<ArrivalProcess> Create(double rate_per_s, double burstiness);

  bool open_loop() const { return rate_ > 0; }
  double rate() const { return rate_; }
  double burstiness() const { return burstiness_; }
  // Seconds to the next arrival. Precondition: open_loop().
  double NextGap(TrafficRng& rng) const;

 private:
  double rate_ = 0;
  double burstiness_ = 1;
};

// System prompts that sequences share, with the share of sequences that start on each:
// "TOKENS:WEIGHT,TOKENS:WEIGHT,..." (weights are relative; "1024" alone is one prompt that
// every sequence shares; "0" or "" is none). TyphoonMLA groups queries by shared prefix, so
// how sequences split across prompts decides how often the hybrid form pays.
struct PromptMix {
  std::vector<int> tokens;
  std::vector<double> weights;

  // INVALID_ARGUMENT naming --system-prompts for a malformed entry, a negative count or a
  // weight that is not positive.
  static absl::StatusOr<PromptMix> Parse(absl::string_view spec);
  // The index of the prompt a new sequence starts on; -1 when there is none.
  int Draw(TrafficRng& rng) const;
  bool empty() const { return tokens.empty(); }
};

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_TRAFFIC_MODEL_H_
