#include "server/service/call_registry.h"

#include "absl/strings/str_cat.h"

namespace mlaserve::service {

absl::Status CallRegistry::Add(DrainableStream* stream, const std::string& client) {
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the server is shutting down");
  int& open = streams_by_client_[client];
  if (max_streams_per_client_ > 0 && open >= max_streams_per_client_) {
    if (open == 0) streams_by_client_.erase(client);
    return absl::ResourceExhaustedError(
        absl::StrCat("max_streams_per_client: ", client, " already holds ", open,
                     " open streams (DecodeStream and AppendKv together); end one first"));
  }
  ++open;
  streams_.emplace(stream, client);
  return absl::OkStatus();
}

void CallRegistry::Remove(DrainableStream* stream) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  auto count = streams_by_client_.find(it->second);
  if (--count->second == 0) streams_by_client_.erase(count);
  streams_.erase(it);
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
  for (const auto& [stream, client] : streams_) stream->Drain();
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
