#include "client/loadgen/multi_target.h"

#include <future>

#include "absl/strings/str_cat.h"

namespace mlaserve::loadgen {

absl::StatusOr<std::unique_ptr<MultiTarget>> MultiTarget::Create(
    std::vector<std::unique_ptr<LoadTarget>> targets, std::vector<std::string> names,
    Spread spread) {
  if (targets.empty()) return absl::InvalidArgumentError("--target: no server");
  absl::StatusOr<TargetModel> first = targets[0]->Model();
  if (!first.ok()) return first.status();
  for (size_t i = 1; i < targets.size(); ++i) {
    absl::StatusOr<TargetModel> m = targets[i]->Model();
    if (!m.ok()) return m.status();
    if (m->name != first->name || m->layers != first->layers || m->heads != first->heads ||
        m->dk() != first->dk()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--target: ", i < names.size() ? names[i] : absl::StrCat("#", i), " serves ", m->name,
          " (", m->layers, " layers, ", m->heads, " heads), the first serves ", first->name, " (",
          first->layers, " layers, ", first->heads, " heads)"));
    }
    // A batch goes to one server whole at most: the smallest limit is everyone's.
    if (m->max_batch > 0 && (first->max_batch == 0 || m->max_batch < first->max_batch)) {
      first->max_batch = m->max_batch;
    }
  }
  return std::unique_ptr<MultiTarget>(new MultiTarget(std::move(targets), *first, spread));
}

int MultiTarget::HashTarget(const std::string& id, int count) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int>(h % static_cast<uint64_t>(count));
}

int MultiTarget::TargetOf(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = placed_.find(id);
  return it != placed_.end() ? it->second : HashTarget(id, static_cast<int>(targets_.size()));
}

absl::Status MultiTarget::RegisterPrefix(const std::string& id, std::span<const Bf16> latent,
                                         int tokens, std::optional<KvDtype> kv_dtype) {
  if (spread_ == Spread::kSequenceHash) {
    return RegisterPrefixOnEvery(targets_, id, latent, tokens, kv_dtype);
  }
  return targets_[HashTarget(id, static_cast<int>(targets_.size()))]->RegisterPrefix(
      id, latent, tokens, kv_dtype);
}

absl::Status MultiTarget::ReleasePrefix(const std::string& id) {
  if (spread_ == Spread::kSequenceHash) return ReleasePrefixOnEvery(targets_, id);
  return targets_[HashTarget(id, static_cast<int>(targets_.size()))]->ReleasePrefix(id);
}

absl::Status MultiTarget::CreateSequence(const std::string& id, const std::string& prefix_id,
                                         std::optional<KvDtype> kv_dtype) {
  const int target =
      HashTarget(prefix_id.empty() || spread_ == Spread::kSequenceHash ? id : prefix_id,
                 static_cast<int>(targets_.size()));
  absl::Status status = targets_[target]->CreateSequence(id, prefix_id, kv_dtype);
  if (status.ok()) {
    std::lock_guard lock(mu_);
    placed_[id] = target;
  }
  return status;
}

absl::Status MultiTarget::ReleaseSequence(const std::string& id) {
  const int target = TargetOf(id);
  absl::Status status = targets_[target]->ReleaseSequence(id);
  std::lock_guard lock(mu_);
  placed_.erase(id);
  return status;
}

absl::Status MultiTarget::AppendKv(const std::string& id, int layer, int64_t position,
                                   std::span<const Bf16> rows) {
  return targets_[TargetOf(id)]->AppendKv(id, layer, position, rows);
}

absl::StatusOr<std::vector<LoadAnswer>> MultiTarget::Decode(const std::vector<LoadQuery>& queries) {
  const int n = static_cast<int>(targets_.size());
  std::vector<std::vector<LoadQuery>> parts(n);
  std::vector<std::vector<size_t>> positions(n);
  for (size_t i = 0; i < queries.size(); ++i) {
    const int t = TargetOf(queries[i].sequence_id);
    parts[t].push_back(queries[i]);
    positions[t].push_back(i);
  }
  std::vector<std::future<absl::StatusOr<std::vector<LoadAnswer>>>> calls(n);
  int last = -1;
  for (int t = 0; t < n; ++t) {
    if (parts[t].empty()) continue;
    if (last >= 0) {
      calls[last] = std::async(
          std::launch::async, [this, last, &parts] { return targets_[last]->Decode(parts[last]); });
    }
    last = t;
  }
  std::vector<LoadAnswer> answers(queries.size());
  absl::Status failed = absl::OkStatus();
  auto gather = [&](int t, absl::StatusOr<std::vector<LoadAnswer>> part) {
    if (!part.ok()) {
      if (failed.ok()) failed = part.status();
      return;
    }
    for (size_t j = 0; j < part->size() && j < positions[t].size(); ++j) {
      answers[positions[t][j]] = (*part)[j];
    }
  };
  // The last part runs on this thread: a single-server call starts no thread at all.
  if (last >= 0) gather(last, targets_[last]->Decode(parts[last]));
  for (int t = 0; t < n; ++t) {
    if (calls[t].valid()) gather(t, calls[t].get());
  }
  if (!failed.ok()) return failed;
  return answers;
}

}  // namespace mlaserve::loadgen
