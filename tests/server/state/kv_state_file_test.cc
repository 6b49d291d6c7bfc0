// The KV state file: an engine restarted from it answers every decode bit for bit as before
// (and as the fp64 golden says), and every way a file can be bad (missing, truncated,
// corrupt, another version or model, over the budget, a save cut short) starts the engine
// empty with a clear status, never with corrupt rows.

#include "server/state/kv_state_file.h"

#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/kv/client_id.h"
#include "server/state/kv_state_keeper.h"
#include "tests/server/engine/engine_scenario.h"
#include "tests/testing/scratch_dir.h"

namespace mlaserve::state {
namespace {

using engine::EngineImpl;
using engine::EngineOptions;
using engine::HostAttentionDevice;
using engine::OwnedDecodeQuery;
using engine::testing::DecodeSync;
using engine::testing::OwnedAnswer;
using engine::testing::Scenario;
using engine::testing::SmallModel;
using ::testing::HasSubstr;

// Removed with everything in it at the test process's exit.
const mlaserve::testing::ScratchDir& Scratch() {
  static const mlaserve::testing::ScratchDir dir("kv-state-file-test");
  return dir;
}

EngineOptions Options(int layers = 2, int64_t budget_mib = 64) {
  EngineOptions options;
  options.model = SmallModel(/*heads=*/8, layers);
  options.weights.seed = 7;
  options.kv.budget_bytes = budget_mib << 20;
  options.kv.page_size = 64;
  return options;
}

std::unique_ptr<EngineImpl> MakeEngine(EngineOptions options = Options()) {
  std::vector<std::unique_ptr<engine::AttentionDevice>> devices;
  devices.push_back(std::make_unique<HostAttentionDevice>());
  auto engine = EngineImpl::Create(std::move(options), std::move(devices));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
// Recomputes the trailing checksum, so a test can change a field behind the checksum.
void Reseal(std::string& bytes) {
  const uLong crc = crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size() - 4);
  const auto crc32 = static_cast<uint32_t>(crc);
  std::memcpy(bytes.data() + bytes.size() - 4, &crc32, 4);
}

class KvStateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scenario_ = std::make_unique<Scenario>(MakeEngine(), /*seed=*/5, /*data_scale=*/0.1);
    Scenario& s = *scenario_;
    s.RegisterPrefix("system", "", 150);
    s.RegisterPrefix("tools", "system", 70);
    s.RegisterPrefix("p8", "", 90, KvDtype::kFp8);
    s.CreateSequence("a", "system", 13);
    s.CreateSequence("b", "tools", 64);
    s.CreateSequence("c", "", 200);
    s.CreateSequence("f8", "p8", 31);
    ASSERT_TRUE(s.engine().ForkSequence("a", "a-fork").ok());
    for (const char* id : {"a", "b", "c", "f8"}) {
      queries_.push_back(s.HeadQuery(id, 1, 2));
      queries_.push_back(s.LatentQuery(id, 0, 1));
    }
    queries_.push_back(s.LatentQuery("a-fork", 1, 1));
    path_ = Scratch().Path(
        std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ".mlakv");
  }

  std::vector<OwnedAnswer> Answers(engine::Engine& e) {
    absl::StatusOr<std::vector<OwnedAnswer>> answers = DecodeSync(e, queries_);
    EXPECT_TRUE(answers.ok()) << answers.status();
    return answers.ok() ? *answers : std::vector<OwnedAnswer>{};
  }

  void Save() {
    const engine::KvCheckpoint checkpoint = scenario_->engine().CheckpointKv();
    absl::StatusOr<KvStateFileInfo> info =
        WriteKvStateFile(path_, checkpoint, "instance-1", "test-mla");
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->sequences, 5);
    EXPECT_EQ(info->prefixes, 3);
    EXPECT_EQ(info->bytes, static_cast<int64_t>(std::filesystem::file_size(path_)));
  }

  // Loads into a fresh engine; on failure the engine must be as empty as a new one.
  absl::Status LoadFails(const std::string& path, EngineOptions options = Options()) {
    auto fresh = MakeEngine(options);
    const engine::KvStoreStats empty = fresh->Stats().kv;
    absl::StatusOr<KvStateFileInfo> loaded = LoadKvStateFile(path, *fresh);
    EXPECT_FALSE(loaded.ok());
    EXPECT_EQ(fresh->Stats().kv, empty);
    return loaded.status();
  }

  std::unique_ptr<Scenario> scenario_;
  std::vector<OwnedDecodeQuery> queries_;
  std::string path_;
};

TEST_F(KvStateFileTest, RestartedEngineAnswersBitForBitAsBefore) {
  const std::vector<OwnedAnswer> before = Answers(scenario_->engine());
  Save();
  auto restarted = MakeEngine();
  absl::StatusOr<KvStateFileInfo> loaded = LoadKvStateFile(path_, *restarted);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->instance_id, "instance-1");
  EXPECT_EQ(loaded->sequences, 5);
  const std::vector<OwnedAnswer> after = Answers(*restarted);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    SCOPED_TRACE(queries_[i].sequence_id);
    EXPECT_EQ(after[i].out, before[i].out);
    EXPECT_EQ(after[i].lse, before[i].lse);
    EXPECT_EQ(after[i].plan.absorb_kv_dtype, before[i].plan.absorb_kv_dtype);
  }
  // And both are right: the bf16 sequences' answers against the fp64 golden of the rows the
  // scenario sent (the FP8 one is held to its own bounds in the engine's tests; the fork,
  // made behind the scenario's back, to its source's answers above).
  for (size_t i = 0; i < after.size(); ++i) {
    if (queries_[i].sequence_id == "f8" || queries_[i].sequence_id == "a-fork") continue;
    const GoldenOutput golden = scenario_->Golden(queries_[i]);
    EXPECT_TRUE(
        mlaserve::testing::AllClose(after[i].out, golden.out, engine::testing::kOutTolerance, true))
        << queries_[i].sequence_id;
    EXPECT_TRUE(mlaserve::testing::AllClose(after[i].lse, golden.lse,
                                            engine::testing::kLseTolerance, false))
        << queries_[i].sequence_id;
  }
  // The restarted engine takes the next step where the old one left off.
  for (const char* id : {"a", "c"}) {
    const absl::StatusOr<engine::SequenceInfo> old_info = scenario_->engine().GetSequence(id);
    const absl::StatusOr<engine::SequenceInfo> new_info = restarted->GetSequence(id);
    ASSERT_TRUE(new_info.ok());
    EXPECT_EQ(*new_info, *old_info);
  }
}

// A server whose cache lives in a GPU's memory restarts from the same file (here the fake
// GPU, host memory and host kernels): the restored pages reach the device with the first
// batch, and every answer is the golden's (and the host engine's, to the GPU's tolerance).
TEST_F(KvStateFileTest, AnEngineOnAGpuRestartsFromTheFile) {
  const std::vector<OwnedAnswer> before = Answers(scenario_->engine());
  Save();
  EngineOptions options = Options();
  options.gpu = "fake-gpu";
  auto on_gpu = EngineImpl::Create(options);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  ASSERT_TRUE(LoadKvStateFile(path_, **on_gpu).ok());
  const std::vector<OwnedAnswer> after = Answers(**on_gpu);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    SCOPED_TRACE(queries_[i].sequence_id);
    // The FP8 sequence's arithmetic differs by design (the GPU keeps its queries bf16): its
    // bounds are SnapMLA's, held in the engine's and the kernels' tests.
    if (queries_[i].sequence_id == "f8") continue;
    EXPECT_TRUE(
        mlaserve::testing::AllCloseF(after[i].out, before[i].out, engine::testing::kOutTolerance));
    if (queries_[i].sequence_id == "a-fork") continue;
    const GoldenOutput golden = scenario_->Golden(queries_[i]);
    EXPECT_TRUE(mlaserve::testing::AllClose(after[i].out, golden.out,
                                            engine::testing::kOutTolerance, true));
  }
}

// A tenant's ids carry its namespace (0xff, name, 0xff), which is not UTF-8: the file keeps
// them as bytes, so tenants come back with their state.
TEST_F(KvStateFileTest, TenantsIdsComeBackInTheirNamespaces) {
  const std::string id = engine::NamespacedId("team-a", "s");
  ASSERT_TRUE(scenario_->engine().CreateSequence(id, "").ok());
  const std::vector<Bf16> rows = scenario_->RandomRows(5);
  ASSERT_TRUE(
      scenario_->engine()
          .AppendKv(id, 0, 0,
                    *TensorView<const Bf16, 2>::Create(std::span<const Bf16>(rows), {5, 576}))
          .ok());
  const engine::KvCheckpoint checkpoint = scenario_->engine().CheckpointKv();
  ASSERT_TRUE(WriteKvStateFile(path_, checkpoint, "instance-t", "test-mla").ok());
  auto restarted = MakeEngine();
  ASSERT_TRUE(LoadKvStateFile(path_, *restarted).ok());
  const absl::StatusOr<engine::SequenceInfo> info = restarted->GetSequence(id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->lengths[0], 5);
  EXPECT_TRUE(absl::IsNotFound(restarted->GetSequence("s").status()));
}

TEST_F(KvStateFileTest, MissingFileIsNotFound) {
  EXPECT_TRUE(absl::IsNotFound(LoadFails(Scratch().Path("never-written.mlakv"))));
}

TEST_F(KvStateFileTest, TruncatedFileIsDataLoss) {
  Save();
  const std::string bytes = ReadAll(path_);
  for (const size_t keep : {size_t{0}, size_t{10}, bytes.size() / 2, bytes.size() - 1}) {
    SCOPED_TRACE(keep);
    WriteAll(path_, bytes.substr(0, keep));
    EXPECT_TRUE(absl::IsDataLoss(LoadFails(path_)));
  }
}

TEST_F(KvStateFileTest, AnyFlippedByteIsDataLoss) {
  Save();
  const std::string bytes = ReadAll(path_);
  // In the header, the manifest, the page records and the checksum itself.
  for (const size_t at :
       {size_t{3}, size_t{20}, size_t{60}, bytes.size() / 2, bytes.size() - 9, bytes.size() - 2}) {
    SCOPED_TRACE(at);
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    WriteAll(path_, bad);
    const absl::Status status = LoadFails(path_);
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("checksum"));
  }
}

TEST_F(KvStateFileTest, OtherVersionIsFailedPrecondition) {
  Save();
  std::string bytes = ReadAll(path_);
  bytes[8] = 2;  // the version's low byte
  Reseal(bytes);
  WriteAll(path_, bytes);
  const absl::Status status = LoadFails(path_);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("version 2"));
}

TEST_F(KvStateFileTest, ResealedGarbageIsStillRefused) {
  Save();
  std::string bytes = ReadAll(path_);
  // A manifest length past the file, and a manifest that does not parse, each behind a
  // valid checksum: the checksum guards against accidents, the checks against the rest.
  std::string long_manifest = bytes;
  long_manifest[16 + 6] = 0x7f;
  Reseal(long_manifest);
  WriteAll(path_, long_manifest);
  EXPECT_TRUE(absl::IsDataLoss(LoadFails(path_)));
  std::string garbled = bytes;
  for (size_t i = 24; i < 40; ++i) garbled[i] = static_cast<char>(0xff);
  Reseal(garbled);
  WriteAll(path_, garbled);
  const absl::Status status = LoadFails(path_);
  EXPECT_TRUE(absl::IsDataLoss(status) || absl::IsInvalidArgument(status)) << status;
}

TEST_F(KvStateFileTest, OtherModelOrPageSizeIsInvalidArgument) {
  Save();
  EXPECT_TRUE(absl::IsInvalidArgument(LoadFails(path_, Options(/*layers=*/3))));
  EngineOptions pages = Options();
  pages.kv.page_size = 32;
  EXPECT_TRUE(absl::IsInvalidArgument(LoadFails(path_, pages)));
}

TEST_F(KvStateFileTest, StateOverTheBudgetIsResourceExhausted) {
  Save();
  EXPECT_TRUE(absl::IsResourceExhausted(LoadFails(path_, Options(2, /*budget_mib=*/1))));
}

// The keeper: a save cut short leaves the previous file to load; a bad file is set aside and
// the engine starts empty; saves replace the file atomically.
TEST_F(KvStateFileTest, KeeperRestoresThePreviousSaveWhenOneWasCutShort) {
  const std::string dir = Scratch().Path("keeper");
  std::filesystem::create_directories(dir);
  KvStateKeeper keeper(scenario_->engine(), dir, "instance-2", "test-mla");
  ASSERT_TRUE(keeper.Save().ok());
  // A kill -9 in the middle of the next save: half a temporary file.
  const std::string saved = ReadAll(keeper.path());
  WriteAll(keeper.path() + ".tmp", saved.substr(0, saved.size() / 3));

  auto restarted = MakeEngine();
  KvStateKeeper next(*restarted, dir, "instance-3", "test-mla");
  const std::optional<KvStateFileInfo> restored = next.Restore();
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->instance_id, "instance-2");
  EXPECT_FALSE(std::filesystem::exists(keeper.path() + ".tmp"));
  EXPECT_EQ(Answers(*restarted).size(), queries_.size());
}

TEST_F(KvStateFileTest, KeeperSetsABadFileAsideAndStartsEmpty) {
  const std::string dir = Scratch().Path("keeper-bad");
  std::filesystem::create_directories(dir);
  KvStateKeeper keeper(scenario_->engine(), dir, "instance-4", "test-mla");
  ASSERT_TRUE(keeper.Save().ok());
  std::string bytes = ReadAll(keeper.path());
  bytes[bytes.size() / 2] ^= 1;
  WriteAll(keeper.path(), bytes);

  auto restarted = MakeEngine();
  KvStateKeeper next(*restarted, dir, "instance-5", "test-mla");
  EXPECT_FALSE(next.Restore().has_value());
  EXPECT_EQ(restarted->Stats().kv.sequences, 0);
  EXPECT_TRUE(std::filesystem::exists(keeper.path() + ".bad"));
  EXPECT_FALSE(std::filesystem::exists(keeper.path()));
}

TEST_F(KvStateFileTest, PeriodicSavesFollowTheStore) {
  const std::string dir = Scratch().Path("keeper-periodic");
  std::filesystem::create_directories(dir);
  {
    KvStateKeeper keeper(scenario_->engine(), dir, "instance-6", "test-mla");
    keeper.StartPeriodicSaves(absl::Milliseconds(20));
    ASSERT_TRUE(scenario_->engine().ReleaseSequence("c").ok());
    absl::SleepFor(absl::Milliseconds(200));
  }
  auto restarted = MakeEngine();
  ASSERT_TRUE(LoadKvStateFile(dir + "/" + KvStateKeeper::kFileName, *restarted).ok());
  EXPECT_EQ(restarted->Stats().kv.sequences, 4);
  EXPECT_TRUE(absl::IsNotFound(restarted->GetSequence("c").status()));
}

}  // namespace
}  // namespace mlaserve::state
