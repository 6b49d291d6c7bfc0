#ifndef MLASERVE_TESTS_SERVER_SERVICE_MOCK_ENGINE_H_
#define MLASERVE_TESTS_SERVER_SERVICE_MOCK_ENGINE_H_

#include <vector>

#include "gmock/gmock.h"
#include "server/engine/engine.h"

namespace mlaserve::service::testing {

class MockEngine : public engine::Engine {
 public:
  MOCK_METHOD(const engine::EngineInfo&, Info, (), (const, override));
  MOCK_METHOD(absl::Status, RegisterPrefix,
              (absl::string_view, absl::string_view, (TensorView<const Bf16, 3>),
               std::optional<KvDtype>),
              (override));
  MOCK_METHOD(absl::Status, ReleasePrefix, (absl::string_view), (override));
  MOCK_METHOD(absl::Status, CreateSequence,
              (absl::string_view, absl::string_view, std::optional<KvDtype>), (override));
  MOCK_METHOD(absl::Status, ForkSequence, (absl::string_view, absl::string_view), (override));
  MOCK_METHOD(absl::Status, ReleaseSequence, (absl::string_view), (override));
  MOCK_METHOD(absl::Status, AppendKv,
              (absl::string_view, int, int64_t, (TensorView<const Bf16, 2>)), (override));
  MOCK_METHOD(absl::Status, AppendKvFp8,
              (absl::string_view, int, int64_t, std::span<const std::byte>, int64_t), (override));
  MOCK_METHOD(absl::StatusOr<engine::SequenceInfo>, GetSequence, (absl::string_view),
              (const, override));
  MOCK_METHOD(engine::ListPage<engine::PrefixListing>, ListPrefixes, (const engine::ListRange&),
              (const, override));
  MOCK_METHOD(engine::ListPage<engine::SequenceListing>, ListSequences,
              (const engine::ListRange&, absl::string_view), (const, override));
  MOCK_METHOD(void, Decode,
              (std::vector<engine::DecodeQuery>, engine::DecodeOptions, engine::DecodeCallback),
              (override));
  MOCK_METHOD(engine::EngineStats, Stats, (), (const, override));
  MOCK_METHOD(absl::Status, Drain, (absl::Time), (override));
  MOCK_METHOD(engine::KvCheckpoint, CheckpointKv, (), (override));
  MOCK_METHOD(absl::Status, RestoreKv, (const engine::KvStateManifest&, engine::KvStatePageReader),
              (override));
};

// A small model the tests can reason about: 4 heads, DeepSeek's head dims, 3 layers.
inline engine::EngineInfo SmallEngineInfo() {
  engine::EngineInfo info;
  info.model.name = "tiny";
  info.model.heads = 4;
  info.model.layers = 3;
  info.model.softmax_scale = 0.125f;
  info.page_size = 16;
  info.devices = {{"ascend910-die", 1, 24, 353.9, 1.6}};
  info.b_theta_by_sq = {12.5, 6.25};
  info.max_batch = 8;
  info.max_sq = 2;
  info.max_queue = 64;
  info.max_wait = absl::Microseconds(200);
  info.kv_budget_bytes = int64_t{1} << 24;
  info.batch_invariant = true;  // not the default, so GetServerInfo shows it carries the value
  return info;
}

}  // namespace mlaserve::service::testing

#endif  // MLASERVE_TESTS_SERVER_SERVICE_MOCK_ENGINE_H_
