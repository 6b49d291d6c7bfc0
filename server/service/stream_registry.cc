#include "server/service/stream_registry.h"

namespace mlaserve::service {

bool StreamRegistry::Add(DrainableStream* stream) {
  std::lock_guard lock(mu_);
  if (draining_) return false;
  streams_.insert(stream);
  return true;
}

void StreamRegistry::Remove(DrainableStream* stream) {
  std::lock_guard lock(mu_);
  streams_.erase(stream);
}

void StreamRegistry::DrainAll() {
  std::lock_guard lock(mu_);
  draining_ = true;
  // Holding the lock keeps every stream alive (Remove waits for it); Drain never calls back.
  for (DrainableStream* stream : streams_) stream->Drain();
}

}  // namespace mlaserve::service
