#ifndef MLASERVE_CLIENT_LOADGEN_MULTI_TARGET_H_
#define MLASERVE_CLIENT_LOADGEN_MULTI_TARGET_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "client/loadgen/load_target.h"

namespace mlaserve::loadgen {

// Several servers as one target (`--target a:1,b:2`), spread as a framework with several
// attention servers would. kPrefixHash (the default): a prefix lives on the server a stable
// hash of its id picks; a sequence on a prefix goes where the prefix is (TyphoonMLA needs a
// prefix's queries together), one without a prefix where the hash of its own id points.
// kSequenceHash, plain hashing (the baseline prefix-aware placement is measured against): every
// sequence where the hash of its own id points, its prefix registered on every server. A Decode
// carrying sequences of several servers becomes one call per server, in parallel, its answers put
// back in the queries' order; it fails if any part fails. Thread-safe.
class MultiTarget final : public LoadTarget {
 public:
  enum class Spread { kPrefixHash, kSequenceHash };

  // FAILED_PRECONDITION naming the target whose model differs from the first's; at least one
  // target.
  static absl::StatusOr<std::unique_ptr<MultiTarget>> Create(
      std::vector<std::unique_ptr<LoadTarget>> targets, std::vector<std::string> names,
      Spread spread = Spread::kPrefixHash);

  // Which target holds `id` (by the rules above); for reports and tests.
  int TargetOf(const std::string& id);
  // The server a stable hash of `id` picks among `count` (FNV-1a, not std::hash: the choice
  // must not change between builds or runs).
  static int HashTarget(const std::string& id, int count);

  absl::StatusOr<TargetModel> Model() override { return model_; }
  absl::Status RegisterPrefix(const std::string& id, std::span<const Bf16> latent, int tokens,
                              std::optional<KvDtype> kv_dtype) override;
  absl::Status ReleasePrefix(const std::string& id) override;
  absl::Status CreateSequence(const std::string& id, const std::string& prefix_id,
                              std::optional<KvDtype> kv_dtype) override;
  absl::Status ReleaseSequence(const std::string& id) override;
  absl::Status AppendKv(const std::string& id, int layer, int64_t position,
                        std::span<const Bf16> rows) override;
  absl::StatusOr<std::vector<LoadAnswer>> Decode(const std::vector<LoadQuery>& queries) override;

 private:
  MultiTarget(std::vector<std::unique_ptr<LoadTarget>> targets, TargetModel model, Spread spread)
      : targets_(std::move(targets)), model_(std::move(model)), spread_(spread) {}

  std::vector<std::unique_ptr<LoadTarget>> targets_;
  const TargetModel model_;
  const Spread spread_;
  std::mutex mu_;
  absl::flat_hash_map<std::string, int> placed_;  // sequence id -> target, while it lives
};

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_MULTI_TARGET_H_
