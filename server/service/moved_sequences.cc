#include "server/service/moved_sequences.h"

#include "absl/strings/str_cat.h"

namespace mlaserve::service {

std::string MovedMessage(absl::string_view sequence_id, absl::string_view target) {
  return absl::StrCat("sequence '", sequence_id, "' moved to server ", target);
}

void MovedSequences::MarkMoving(std::span<const std::string> sequence_ids,
                                const std::string& target) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : sequence_ids) moves_.insert_or_assign(id, Move{target, false});
  any_.store(!moves_.empty(), std::memory_order_release);
}

void MovedSequences::MarkMoved(std::span<const std::string> sequence_ids,
                               const std::string& target) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : sequence_ids) moves_.insert_or_assign(id, Move{target, true});
  any_.store(!moves_.empty(), std::memory_order_release);
}

void MovedSequences::Forget(std::span<const std::string> sequence_ids) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : sequence_ids) moves_.erase(id);
  any_.store(!moves_.empty(), std::memory_order_release);
}

void MovedSequences::Forget(absl::string_view sequence_id) {
  if (!any_.load(std::memory_order_acquire)) return;
  absl::MutexLock lock(&mu_);
  moves_.erase(sequence_id);
  any_.store(!moves_.empty(), std::memory_order_release);
}

absl::Status MovedSequences::CheckSlow(absl::string_view sequence_id,
                                       absl::string_view field) const {
  absl::MutexLock lock(&mu_);
  auto it = moves_.find(sequence_id);
  if (it == moves_.end()) return absl::OkStatus();
  if (!it->second.done) {
    return absl::UnavailableError(absl::StrCat(field, ": sequence '", sequence_id,
                                               "' is moving to server ", it->second.target,
                                               "; retry"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(field, ": ", MovedMessage(sequence_id, it->second.target)));
}

}  // namespace mlaserve::service
