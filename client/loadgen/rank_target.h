#ifndef MLASERVE_CLIENT_LOADGEN_RANK_TARGET_H_
#define MLASERVE_CLIENT_LOADGEN_RANK_TARGET_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/loadgen/load_target.h"

namespace mlaserve::loadgen {

// One target per rank (worker), as a serving framework whose data-parallel ranks each run
// their own client (`--client_per_rank`): a sequence's calls go to its rank's target, found
// from the rank its id carries (`.../rN/...` in continuous traffic, `.../wN/...` in the fixed
// workload); a prefix is registered and released through every rank's target, since each
// places its own sequences on it. Thread-safe when the targets are.
class RankTarget final : public LoadTarget {
 public:
  explicit RankTarget(std::vector<std::unique_ptr<LoadTarget>> ranks) : ranks_(std::move(ranks)) {}

  // The rank `sequence_id` belongs to, modulo the number of ranks; 0 when it names none.
  static int RankOf(const std::string& sequence_id, int ranks);
  // The rank `sequence_id` names (its last "/rN/" or "/wN/" segment), if any.
  static std::optional<int> RankIn(const std::string& sequence_id);

  absl::StatusOr<TargetModel> Model() override { return ranks_.front()->Model(); }
  absl::Status RegisterPrefix(const std::string& id, std::span<const Bf16> latent, int tokens,
                              std::optional<KvDtype> kv_dtype) override;
  absl::Status ReleasePrefix(const std::string& id) override;
  absl::Status CreateSequence(const std::string& id, const std::string& prefix_id,
                              std::optional<KvDtype> kv_dtype) override;
  absl::Status ReleaseSequence(const std::string& id) override;
  absl::Status AppendKv(const std::string& id, int layer, int64_t position,
                        std::span<const Bf16> rows) override;
  // A rank's call carries its own sequences: the first query's rank takes the whole call.
  absl::StatusOr<std::vector<LoadAnswer>> Decode(const std::vector<LoadQuery>& queries) override;

 private:
  LoadTarget& For(const std::string& sequence_id) {
    return *ranks_[RankOf(sequence_id, static_cast<int>(ranks_.size()))];
  }

  std::vector<std::unique_ptr<LoadTarget>> ranks_;
};

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_RANK_TARGET_H_
