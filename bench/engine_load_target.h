#ifndef MLASERVE_BENCH_ENGINE_LOAD_TARGET_H_
#define MLASERVE_BENCH_ENGINE_LOAD_TARGET_H_

#include "client/loadgen/load_target.h"
#include "server/engine/engine.h"

namespace mlaserve::bench {

// The engine called directly in this process: the same batches as over gRPC, without the
// wire, for the service benchmark's comparison.
class EngineLoadTarget final : public loadgen::LoadTarget {
 public:
  explicit EngineLoadTarget(engine::Engine& engine) : engine_(engine) {}

  absl::StatusOr<loadgen::TargetModel> Model() override;
  absl::Status RegisterPrefix(const std::string& id, std::span<const Bf16> latent, int tokens,
                              std::optional<KvDtype> kv_dtype) override;
  absl::Status ReleasePrefix(const std::string& id) override { return engine_.ReleasePrefix(id); }
  absl::Status CreateSequence(const std::string& id, const std::string& prefix_id,
                              std::optional<KvDtype> kv_dtype) override {
    return engine_.CreateSequence(id, prefix_id, kv_dtype);
  }
  absl::Status ReleaseSequence(const std::string& id) override {
    return engine_.ReleaseSequence(id);
  }
  absl::Status AppendKv(const std::string& id, int layer, int64_t position,
                        std::span<const Bf16> rows) override;
  absl::StatusOr<std::vector<loadgen::LoadAnswer>> Decode(
      const std::vector<loadgen::LoadQuery>& queries) override;

 private:
  engine::Engine& engine_;
};

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_ENGINE_LOAD_TARGET_H_
