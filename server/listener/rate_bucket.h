#ifndef MLASERVE_SERVER_LISTENER_RATE_BUCKET_H_
#define MLASERVE_SERVER_LISTENER_RATE_BUCKET_H_

#include <algorithm>

#include "absl/time/time.h"

namespace mlaserve::listener {

// A token bucket: `burst` events at once, refilled at `per_second`. Not thread-safe.
class RateBucket {
 public:
  RateBucket(double burst, double per_second, absl::Time now)
      : burst_(burst), per_second_(per_second), tokens_(burst), last_(now) {}

  // Takes one token if there is one.
  bool Take(absl::Time now) {
    tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * per_second_);
    last_ = now;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }

 private:
  double burst_;
  double per_second_;
  double tokens_;
  absl::Time last_;
};

}  // namespace mlaserve::listener

#endif  // MLASERVE_SERVER_LISTENER_RATE_BUCKET_H_
