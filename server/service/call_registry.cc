#include "server/service/call_registry.h"

namespace mlaserve::service {

bool CallRegistry::Add(DrainableStream* stream) {
  absl::MutexLock lock(&mu_);
  if (draining_) return false;
  streams_.insert(stream);
  return true;
}

void CallRegistry::Remove(DrainableStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
}

bool CallRegistry::BeginUnary() {
  absl::MutexLock lock(&mu_);
  if (draining_) return false;
  ++unary_calls_;
  return true;
}

void CallRegistry::EndUnary() {
  absl::MutexLock lock(&mu_);
  --unary_calls_;
}

int CallRegistry::DrainAll() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  // Holding the lock keeps every stream alive (Remove waits for it); Drain never calls back.
  for (DrainableStream* stream : streams_) stream->Drain();
  return static_cast<int>(streams_.size());
}

bool CallRegistry::WaitUntilIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return unary_calls_ == 0 && streams_.empty();
  };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

}  // namespace mlaserve::service
