#ifndef MLASERVE_TESTS_CLIENT_LOADGEN_FAKE_LOAD_TARGET_H_
#define MLASERVE_TESTS_CLIENT_LOADGEN_FAKE_LOAD_TARGET_H_

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/loadgen/load_target.h"

namespace mlaserve::loadgen {

// A server as far as the traffic can tell: sequences with a length per layer, prefixes, and a
// decode that takes a fixed time. It checks what a real server would refuse (unknown ids,
// appends not at the end, a batch over its max) and remembers every breach.
class FakeTarget final : public LoadTarget {
 public:
  static constexpr int kLayers = 2;
  static constexpr int kMaxBatch = 8;
  // `mark` is put in every answer's group_size, so a test can tell which fake answered.
  explicit FakeTarget(std::chrono::microseconds decode_time, int mark = 0)
      : decode_time_(decode_time), mark_(mark) {}

  absl::StatusOr<TargetModel> Model() override { return model_; }
  absl::Status RegisterPrefix(const std::string& id, std::span<const Bf16> latent, int tokens,
                              std::optional<KvDtype>) override {
    std::lock_guard lock(mu_);
    if (latent.size() != static_cast<size_t>(kLayers) * tokens * 8) Breach("prefix shape");
    prefixes_[id] = tokens;
    return absl::OkStatus();
  }
  absl::Status ReleasePrefix(const std::string& id) override {
    std::lock_guard lock(mu_);
    if (prefixes_.erase(id) == 0) Breach("release of an unknown prefix");
    return absl::OkStatus();
  }
  absl::Status CreateSequence(const std::string& id, const std::string& prefix_id,
                              std::optional<KvDtype>) override {
    std::lock_guard lock(mu_);
    int start = 0;
    if (!prefix_id.empty()) {
      auto it = prefixes_.find(prefix_id);
      if (it == prefixes_.end()) return absl::NotFoundError(prefix_id);
      start = it->second;
      ++starts_on_[prefix_id];
    }
    if (!sequences_.emplace(id, std::vector<int64_t>(kLayers, start)).second) Breach("id reused");
    ++created_;
    return absl::OkStatus();
  }
  absl::Status ReleaseSequence(const std::string& id) override {
    std::lock_guard lock(mu_);
    if (sequences_.erase(id) == 0) Breach("release of an unknown sequence");
    return absl::OkStatus();
  }
  absl::Status AppendKv(const std::string& id, int layer, int64_t position,
                        std::span<const Bf16> rows) override {
    std::lock_guard lock(mu_);
    auto it = sequences_.find(id);
    if (it == sequences_.end()) return absl::NotFoundError(id);
    if (it->second[layer] != position) Breach("append not at the end");
    it->second[layer] += static_cast<int64_t>(rows.size() / 8);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<LoadAnswer>> Decode(const std::vector<LoadQuery>& queries) override {
    {
      std::lock_guard lock(mu_);
      if (decode_error != absl::StatusCode::kOk) return absl::Status(decode_error, "refused");
      if (static_cast<int>(queries.size()) > model_.max_batch) Breach("batch over the max");
      batch_sizes_.push_back(static_cast<int>(queries.size()));
      for (const LoadQuery& q : queries) {
        auto it = sequences_.find(q.sequence_id);
        if (it == sequences_.end()) return absl::NotFoundError(q.sequence_id);
        if (it->second[q.layer] != q.append_position) Breach("decode append not at the end");
        ++it->second[q.layer];
        ++steps_by_sequence_[q.sequence_id];
      }
    }
    std::this_thread::sleep_for(decode_time_);
    LoadAnswer a;
    a.queue_us = 10;
    a.device_host_us = 20;
    a.device_modeled_us = 15;
    a.hybrid = true;
    a.group_size = mark_;
    return std::vector<LoadAnswer>(queries.size(), a);
  }

  TargetModel model_{"fake", kLayers, 2, 4, 2, 6, kMaxBatch, std::nullopt};
  absl::StatusCode decode_error = absl::StatusCode::kOk;  // set: every Decode fails so
  std::mutex mu_;
  std::vector<std::string> breaches_;
  std::map<std::string, std::vector<int64_t>> sequences_;
  std::map<std::string, int> prefixes_;
  std::map<std::string, int> starts_on_;
  std::map<std::string, int> steps_by_sequence_;  // decode queries, all layers
  std::vector<int> batch_sizes_;
  int created_ = 0;

 private:
  void Breach(const std::string& what) { breaches_.push_back(what); }
  const std::chrono::microseconds decode_time_;
  const int mark_;
};

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_TESTS_CLIENT_LOADGEN_FAKE_LOAD_TARGET_H_
