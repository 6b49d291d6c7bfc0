#ifndef MLASERVE_SERVER_LISTENER_CLIENT_RATES_H_
#define MLASERVE_SERVER_LISTENER_CLIENT_RATES_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/listener/http2_guard_limits.h"
#include "server/listener/rate_bucket.h"

namespace mlaserve::listener {

// One client's resets and stream openings over all its connections (a flood spread over many
// connections is still one client's). Shared by the client's connections; thread-safe.
class ClientRates {
 public:
  ClientRates(const Http2GuardLimits& limits, absl::Time now)
      : resets_(limits.reset_burst * limits.client_factor,
                limits.resets_per_second * limits.client_factor, now),
        streams_(limits.stream_burst * limits.client_factor,
                 limits.streams_per_second * limits.client_factor, now) {}

  bool TakeReset(absl::Time now) {
    absl::MutexLock lock(&mu_);
    return resets_.Take(now);
  }
  bool TakeStream(absl::Time now) {
    absl::MutexLock lock(&mu_);
    return streams_.Take(now);
  }

 private:
  absl::Mutex mu_;
  RateBucket resets_ ABSL_GUARDED_BY(mu_);
  RateBucket streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mlaserve::listener

#endif  // MLASERVE_SERVER_LISTENER_CLIENT_RATES_H_
