#ifndef MLASERVE_SERVER_SERVICE_STREAM_REGISTRY_H_
#define MLASERVE_SERVER_SERVICE_STREAM_REGISTRY_H_

#include <mutex>

#include "absl/container/flat_hash_set.h"

namespace mlaserve::service {

// A long-lived stream that must end by itself when the server drains: Server::Shutdown only
// cancels calls at its deadline, and a serving worker keeps its DecodeStream open forever.
class DrainableStream {
 public:
  virtual ~DrainableStream() = default;
  // Stop taking requests; end once those already taken are answered. Called with the
  // registry's lock held: must not call back into the registry.
  virtual void Drain() = 0;
};

// The open streams, so that a drain reaches each of them.
class StreamRegistry {
 public:
  // False once draining: the stream should end at once.
  bool Add(DrainableStream* stream);
  void Remove(DrainableStream* stream);
  // Drains every open stream, and every stream added from now on is refused.
  void DrainAll();

 private:
  std::mutex mu_;
  bool draining_ = false;
  absl::flat_hash_set<DrainableStream*> streams_;
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_STREAM_REGISTRY_H_
