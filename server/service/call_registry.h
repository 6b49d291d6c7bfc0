#ifndef MLASERVE_SERVER_SERVICE_CALL_REGISTRY_H_
#define MLASERVE_SERVER_SERVICE_CALL_REGISTRY_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

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

// The calls in flight, so that a drain reaches each stream and the server knows when the
// last call has ended: gRPC's own shutdown also waits for idle connections to close, which
// a client may never do, so the server ends them once no call is left.
//
// It also holds each client to its share of open streams: a stream costs the server nothing
// while idle, but hundreds of them from one client, spread over many connections, would
// otherwise be bounded only by the file descriptor limit.
class CallRegistry {
 public:
  // `max_streams_per_client`: open streams (DecodeStream, AppendKv) one client may hold over
  // all its connections; 0 for no limit.
  explicit CallRegistry(int max_streams_per_client = 0)
      : max_streams_per_client_(max_streams_per_client) {}

  // Registers an open stream of `client` (a tenant, or a peer address when single-tenant).
  // UNAVAILABLE once draining, RESOURCE_EXHAUSTED when the client already holds its limit:
  // the stream is then not registered and should end at once with that status.
  absl::Status Add(DrainableStream* stream, const std::string& client);
  void Remove(DrainableStream* stream);
  // A unary call began or ended. Begin is false once draining: refuse the call.
  bool BeginUnary();
  void EndUnary();

  // Drains every open stream, and every stream or unary call from now on is refused.
  // Returns how many streams were open.
  int DrainAll();
  // True once no call is in flight; false if `deadline` came first.
  bool WaitUntilIdle(absl::Time deadline);

 private:
  absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int unary_calls_ ABSL_GUARDED_BY(mu_) = 0;
  const int max_streams_per_client_;
  // Each open stream and whose it is; the count of each client's open streams.
  absl::flat_hash_map<DrainableStream*, std::string> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> streams_by_client_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_CALL_REGISTRY_H_
