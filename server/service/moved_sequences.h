#ifndef MLASERVE_SERVER_SERVICE_MOVED_SEQUENCES_H_
#define MLASERVE_SERVER_SERVICE_MOVED_SEQUENCES_H_

#include <atomic>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace mlaserve::service {

// Sequences this server has moved, or is moving, to another (MigrateSequences): every call
// naming one is answered from here instead of the engine. Check costs one atomic load while
// nothing was ever moved. Thread-safe.
class MovedSequences {
 public:
  // While the last rows go over: calls are UNAVAILABLE (the client library retries).
  void MarkMoving(std::span<const std::string> sequence_ids, const std::string& target);
  // Done: calls are FAILED_PRECONDITION "sequence 'ID' moved to server TARGET".
  void MarkMoved(std::span<const std::string> sequence_ids, const std::string& target);
  // A move that failed: the sequences are served here again.
  void Forget(std::span<const std::string> sequence_ids);
  // A new sequence under a moved id lives here again.
  void Forget(absl::string_view sequence_id);

  // OK unless `sequence_id` (an engine id) was moved or is moving; `field` names it.
  absl::Status Check(absl::string_view sequence_id, absl::string_view field) const {
    if (!any_.load(std::memory_order_acquire)) return absl::OkStatus();
    return CheckSlow(sequence_id, field);
  }

 private:
  struct Move {
    std::string target;
    bool done = false;
  };
  absl::Status CheckSlow(absl::string_view sequence_id, absl::string_view field) const;

  std::atomic<bool> any_{false};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Move> moves_ ABSL_GUARDED_BY(mu_);
};

// The message a moved sequence's calls carry: clients find the new server in it.
std::string MovedMessage(absl::string_view sequence_id, absl::string_view target);

}  // namespace mlaserve::service

#endif  // MLASERVE_SERVER_SERVICE_MOVED_SEQUENCES_H_
