#include "client/loadgen/traffic_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mlaserve::loadgen {
namespace {

absl::Status Bad(absl::string_view flag, absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", spec, ": ", why));
}

}  // namespace

absl::StatusOr<LengthDistribution> LengthDistribution::Parse(absl::string_view spec,
                                                             absl::string_view flag, int max) {
  LengthDistribution d;
  d.spec_ = std::string(spec);
  d.max_ = max;
  const std::pair<absl::string_view, absl::string_view> kind_args =
      absl::StrSplit(spec, absl::MaxSplits(':', 1));
  const absl::string_view kind = kind_args.first;
  const absl::string_view args = kind_args.second;
  const std::vector<absl::string_view> parts = absl::StrSplit(args, ',');
  auto integer = [&](absl::string_view text, int* out) -> absl::Status {
    if (!absl::SimpleAtoi(text, out) || *out < 1) {
      return Bad(flag, spec, absl::StrCat("'", text, "' is not a whole number of at least 1"));
    }
    return absl::OkStatus();
  };
  int smallest = 1;
  if (kind == "fixed" && parts.size() == 1) {
    d.kind_ = Kind::kFixed;
    if (absl::Status s = integer(parts[0], &d.a_); !s.ok()) return s;
    smallest = d.a_;
  } else if (kind == "uniform" && parts.size() == 2) {
    d.kind_ = Kind::kUniform;
    if (absl::Status s = integer(parts[0], &d.a_); !s.ok()) return s;
    if (absl::Status s = integer(parts[1], &d.b_); !s.ok()) return s;
    if (d.a_ > d.b_) return Bad(flag, spec, "the lower bound is above the upper");
    if (d.b_ > max) return Bad(flag, spec, absl::StrCat("the upper bound exceeds ", max));
    smallest = d.a_;
  } else if (kind == "lognormal" && parts.size() == 2) {
    d.kind_ = Kind::kLogNormal;
    if (!absl::SimpleAtod(parts[0], &d.median_) || !(d.median_ >= 1) || !std::isfinite(d.median_)) {
      return Bad(flag, spec, "the median must be a number of at least 1");
    }
    if (!absl::SimpleAtod(parts[1], &d.sigma_) || !(d.sigma_ >= 0) || !std::isfinite(d.sigma_)) {
      return Bad(flag, spec, "sigma must be a number of at least 0");
    }
  } else if (kind == "file" && !args.empty()) {
    d.kind_ = Kind::kFile;
    std::ifstream in{std::string(args)};
    if (!in) return Bad(flag, spec, "cannot read the file");
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      absl::string_view text = absl::StripAsciiWhitespace(line);
      if (text.empty() || absl::StartsWith(text, "#")) continue;
      int length = 0;
      if (!absl::SimpleAtoi(text, &length) || length < 1) {
        return Bad(flag, spec, absl::StrCat("line ", number, ": '", text, "' is not a length"));
      }
      d.lengths_.push_back(length);
    }
    if (d.lengths_.empty()) return Bad(flag, spec, "the file holds no length");
    smallest = *std::min_element(d.lengths_.begin(), d.lengths_.end());
    if (const int largest = *std::max_element(d.lengths_.begin(), d.lengths_.end());
        largest > max) {
      return Bad(flag, spec, absl::StrCat("a length of ", largest, " exceeds ", max));
    }
  } else {
    return Bad(flag, spec, "expected fixed:N, uniform:A,B, lognormal:MEDIAN,SIGMA or file:PATH");
  }
  if (smallest > max) {
    return Bad(flag, spec, absl::StrCat("every draw would exceed the limit of ", max));
  }
  return d;
}

int LengthDistribution::Draw(TrafficRng& rng) const {
  int value = 1;
  switch (kind_) {
    case Kind::kFixed:
      value = a_;
      break;
    case Kind::kUniform:
      value = std::uniform_int_distribution<int>(a_, b_)(rng);
      break;
    case Kind::kLogNormal: {
      if (sigma_ == 0) {  // std::lognormal_distribution needs a positive sigma
        value = static_cast<int>(std::lround(median_));
        break;
      }
      const double x = std::lognormal_distribution<double>(std::log(median_), sigma_)(rng);
      value = static_cast<int>(std::lround(std::min(x, 1e9)));
      break;
    }
    case Kind::kFile:
      value = lengths_[std::uniform_int_distribution<size_t>(0, lengths_.size() - 1)(rng)];
      break;
  }
  return std::clamp(value, 1, max_);
}

absl::StatusOr<ArrivalProcess> ArrivalProcess::Create(double rate_per_s, double burstiness) {
  if (!(rate_per_s >= 0) || !std::isfinite(rate_per_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--arrival-rate=", rate_per_s, ": must be 0 (closed loop) or more"));
  }
  if (!(burstiness > 0) || !std::isfinite(burstiness)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--burstiness=", burstiness, ": must be above 0 (1 is Poisson)"));
  }
  ArrivalProcess p;
  p.rate_ = rate_per_s;
  p.burstiness_ = burstiness;
  return p;
}

double ArrivalProcess::NextGap(TrafficRng& rng) const {
  return std::gamma_distribution<double>(burstiness_, 1.0 / (rate_ * burstiness_))(rng);
}

absl::StatusOr<PromptMix> PromptMix::Parse(absl::string_view spec) {
  PromptMix mix;
  if (spec.empty() || spec == "0") return mix;
  for (absl::string_view entry : absl::StrSplit(spec, ',')) {
    const std::pair<absl::string_view, absl::string_view> tw =
        absl::StrSplit(entry, absl::MaxSplits(':', 1));
    int tokens = 0;
    double weight = 1;
    if (!absl::SimpleAtoi(tw.first, &tokens) || tokens < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--system-prompts=", spec, ": '", entry,
                                                     "' needs a token count of at least 1"));
    }
    if (!tw.second.empty() &&
        (!absl::SimpleAtod(tw.second, &weight) || !(weight > 0) || !std::isfinite(weight))) {
      return absl::InvalidArgumentError(absl::StrCat("--system-prompts=", spec, ": '", entry,
                                                     "' needs a positive weight after ':'"));
    }
    mix.tokens.push_back(tokens);
    mix.weights.push_back(weight);
  }
  return mix;
}

int PromptMix::Draw(TrafficRng& rng) const {
  if (tokens.empty()) return -1;
  return std::discrete_distribution<int>(weights.begin(), weights.end())(rng);
}

}  // namespace mlaserve::loadgen
