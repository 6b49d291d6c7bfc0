#ifndef MLASERVE_SERVER_ENGINE_BATCHING_BATCH_POLICY_H_
#define MLASERVE_SERVER_ENGINE_BATCHING_BATCH_POLICY_H_

#include "absl/time/time.h"

namespace mlaserve::engine {

// When waiting Decode calls become a device batch: adaptive batching, as Triton's dynamic
// batcher and vLLM's continuous batching do it.
//  - A device is idle: cut at once. A lone query never waits for company it would not get
//    (the old fixed max_wait cost every light-load call its full 500 us).
//  - Every device is busy: keep the calls waiting, so the next batch takes all that arrived
//    while the devices worked, until a device frees up ...
//  - ... or the waiting queries fill a batch (max_batch), or the oldest has waited max_wait
//    (the cap): then cut, if some device has room to queue the batch behind its current one.
//  - No device has room: wait; under load the batcher's bounded queue is where work waits.
struct BatchPolicy {
  int max_batch = 256;
  absl::Duration max_wait = absl::Microseconds(500);

  struct Devices {
    int idle = 0;           // devices with nothing queued or running
    bool has_room = false;  // some device can take another batch
  };
  struct Decision {
    bool cut = false;
    // Not cutting: when time alone would make it cut (InfiniteFuture: only a device freeing
    // up or more calls arriving can).
    absl::Time recheck = absl::InfiniteFuture();
  };

  // `oldest` is the submission time of the longest-waiting call, `queued` the queries
  // waiting (0: nothing to cut).
  Decision Decide(absl::Time now, absl::Time oldest, int queued, Devices devices) const {
    if (queued <= 0) return {};
    if (devices.idle > 0) return {true};
    if (!devices.has_room) return {};
    if (queued >= max_batch || now >= oldest + max_wait) return {true};
    return {false, oldest + max_wait};
  }
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_BATCHING_BATCH_POLICY_H_
