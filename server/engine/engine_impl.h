#ifndef MLASERVE_SERVER_ENGINE_ENGINE_IMPL_H_
#define MLASERVE_SERVER_ENGINE_ENGINE_IMPL_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "server/engine/batch_run.h"
#include "server/engine/batching/batcher.h"
#include "server/engine/devices/attention_device.h"
#include "server/engine/devices/device_pool.h"
#include "server/engine/engine.h"
#include "server/engine/kv/kv_store.h"
#include "server/engine/model/model_weights.h"
#include "server/engine/plan/planner.h"

namespace mlaserve::engine {

// The Engine: a KV store, the model's weights, a TyphoonMLA planner, a batcher and a device
// pool. A Decode is validated (ValidateDecodeCall), queued (Batcher), cut into a batch that
// applies its appends and is planned on the batcher's thread, and prepared, run and answered
// on the least-loaded device's thread (BatchRun). docs/architecture.md follows one through.
class EngineImpl final : public Engine {
 public:
  // `devices` overrides the pool (tests inject failing or host devices); empty means "build
  // options.devices emulated NPUs of options.profile".
  static absl::StatusOr<std::unique_ptr<EngineImpl>> Create(
      EngineOptions options, std::vector<std::unique_ptr<AttentionDevice>> devices = {});
  ~EngineImpl() override;

  const EngineInfo& Info() const override { return info_; }
  absl::Status RegisterPrefix(absl::string_view prefix_id, absl::string_view parent_id,
                              TensorView<const Bf16, 3> latent,
                              std::optional<KvDtype> kv_dtype = std::nullopt) override;
  absl::Status ReleasePrefix(absl::string_view prefix_id) override;
  absl::Status CreateSequence(absl::string_view sequence_id, absl::string_view prefix_id,
                              std::optional<KvDtype> kv_dtype = std::nullopt) override;
  absl::Status ForkSequence(absl::string_view source_id, absl::string_view new_id) override;
  absl::Status ReleaseSequence(absl::string_view sequence_id) override;
  absl::Status AppendKv(absl::string_view sequence_id, int layer, int64_t start_position,
                        TensorView<const Bf16, 2> rows) override;
  absl::Status AppendKvFp8(absl::string_view sequence_id, int layer, int64_t start_position,
                           std::span<const std::byte> records, int64_t n) override;
  absl::StatusOr<SequenceInfo> GetSequence(absl::string_view sequence_id) const override;
  ListPage<PrefixListing> ListPrefixes(const ListRange& range) const override {
    return store_->ListPrefixes(range);
  }
  ListPage<SequenceListing> ListSequences(const ListRange& range,
                                          absl::string_view on_prefix_id) const override {
    return store_->ListSequences(range, on_prefix_id);
  }
  void Decode(std::vector<DecodeQuery> queries, DecodeOptions options,
              DecodeCallback done) override;
  EngineStats Stats() const override;
  std::shared_ptr<void> MapHostMemory(const void* data, int64_t bytes) override;
  absl::Status Health() const override;
  absl::Status Drain(absl::Time deadline) override;
  KvCheckpoint CheckpointKv() override { return store_->Checkpoint(); }
  absl::Status RestoreKv(const KvStateManifest& manifest, KvStatePageReader read_page) override {
    return store_->Restore(manifest, read_page);
  }

  const Planner& planner() const { return planner_; }
  KvStore& store() { return *store_; }
  const ModelWeights& weights() const { return weights_; }

 private:
  EngineImpl(EngineOptions options, ModelWeights weights, std::unique_ptr<KvStore> store,
             DeviceRates rates, std::vector<std::unique_ptr<AttentionDevice>> devices);

  // The batcher's hand-off: stage 1 of a BatchRun here, the rest on a device's thread.
  void CutBatch(std::vector<PendingCall> calls);
  void CallAnswered();

  const EngineOptions options_;
  ModelWeights weights_;
  std::unique_ptr<KvStore> store_;
  Planner planner_;
  EngineInfo info_;
  std::unique_ptr<DevicePool> pool_;
  BatchCounters counters_;
  BatchContext context_;

  std::mutex calls_mu_;
  std::condition_variable calls_done_;
  int64_t calls_in_flight_ = 0;  // accepted, not yet answered; guarded by calls_mu_

  std::unique_ptr<Batcher> batcher_;  // last: its thread uses everything above
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_ENGINE_IMPL_H_
