// Many threads appending, forking, snapshotting and releasing against one store, with every
// snapshot checked row by row against what its thread knows it wrote. Also run under
// ThreadSanitizer (`ctest --preset tsan -R engine`).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/mla/naive.h"
#include "server/engine/kv/kv_store.h"
#include "tests/server/engine/kv/kv_store_test_util.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::kPageSize;
using ::mlaserve::engine::testing::Latent;
using ::mlaserve::engine::testing::ReadSequence;
using ::mlaserve::engine::testing::Rows;
using ::mlaserve::engine::testing::TinyModel;
using ::mlaserve::engine::testing::View2;

constexpr int kStressLayers = 2;
constexpr int kWorkers = 4;
constexpr int kOpsPerWorker = 20000;
constexpr int kMaxSequencesPerWorker = 6;
constexpr int kMaxLength = 60;
// Stop early on slow (sanitised) builds so the test stays well inside its budget.
constexpr auto kTimeLimit = std::chrono::seconds(8);

struct Prefixes {
  Latent sys{1, kStressLayers, 0, 10, 20};    // root
  Latent child{2, kStressLayers, 10, 7, 20};  // "sys/a" extends it
  std::vector<Latent> dynamic;                // "dyn{k}", registered and released all the time
  Prefixes() {
    for (int k = 0; k < 4; ++k) dynamic.emplace_back(100 + k, kStressLayers, 0, 5 + k, 20);
  }
};

class StressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = TinyModel(kStressLayers);
    width_ = model_.dk_latent();
    store_ = *KvStore::Create(model_, KvStoreOptions{.budget_bytes = 80 * kPageSize * width_ * 2,
                                                     .page_size = kPageSize});
    weights_ = std::make_unique<ModelWeights>(*ModelWeights::FromSeed(model_, 3));
    ASSERT_TRUE(store_->RegisterPrefix("sys", "", prefixes_.sys.View()).ok());
    ASSERT_TRUE(store_->RegisterPrefix("sys/a", "sys", prefixes_.child.View()).ok());
    // Referenced, so never evicted however tight memory gets; the dyn prefixes are not.
    ASSERT_TRUE(store_->CreateSequence("anchor", "sys/a").ok());
    sys_key_ = store_->GetPrefix("sys")->key;
    deadline_ = std::chrono::steady_clock::now() + kTimeLimit;
  }

  bool TimeIsUp() const { return std::chrono::steady_clock::now() > deadline_; }

  // The rows a sequence created on `prefix` starts with, per layer.
  std::vector<std::vector<Bf16>> PrefixRows(const std::string& prefix) const {
    std::vector<std::vector<Bf16>> rows(kStressLayers);
    if (prefix.empty()) return rows;
    for (int l = 0; l < kStressLayers; ++l) {
      if (prefix == "sys" || prefix == "sys/a") rows[l] = prefixes_.sys.Layer(l);
      if (prefix == "sys/a") {
        const std::vector<Bf16> own = prefixes_.child.Layer(l);
        rows[l].insert(rows[l].end(), own.begin(), own.end());
      }
      if (prefix.starts_with("dyn")) rows[l] = prefixes_.dynamic[prefix[3] - '0'].Layer(l);
    }
    return rows;
  }

  void Worker(int w);
  void PrefixChurn();
  void Reader();

  ModelConfig model_;
  int width_ = 0;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<ModelWeights> weights_;
  Prefixes prefixes_;
  PrefixKey sys_key_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::array<std::atomic<int>, kWorkers> latest_id_{};  // for the reader to aim at
  std::atomic<bool> workers_done_{false};
  std::atomic<int> snapshots_checked_{0};
  std::atomic<int> exhausted_{0};
};

// Owns its sequences, so it knows every row they must hold.
void StressTest::Worker(int w) {
  std::mt19937 rng(w);
  std::map<std::string, std::vector<std::vector<Bf16>>> expected;  // id -> [layer] rows
  int next_id = 0;
  uint64_t next_tag = static_cast<uint64_t>(w) << 32;
  const auto pick = [&]() -> std::string {
    auto it = expected.begin();
    std::advance(it, std::uniform_int_distribution<int>(0, expected.size() - 1)(rng));
    return it->first;
  };
  const auto verify = [&](const KvSnapshot& snapshot, const std::vector<Bf16>& rows) {
    ASSERT_EQ(ReadSequence(snapshot, 0), rows) << snapshot.sequence(0).id;
    ++snapshots_checked_;
  };
  const auto release = [&](const std::string& id) {
    ASSERT_TRUE(store_->ReleaseSequence(id).ok());
    expected.erase(id);
  };

  for (int op = 0; op < kOpsPerWorker && !TimeIsUp(); ++op) {
    const int choice = std::uniform_int_distribution<int>(0, 9)(rng);
    if (expected.empty() || (choice == 0 && expected.size() < kMaxSequencesPerWorker)) {
      static const char* kPrefixes[] = {"", "sys", "sys/a", "dyn0", "dyn1", "dyn2", "dyn3"};
      const std::string prefix = kPrefixes[std::uniform_int_distribution<int>(0, 6)(rng)];
      latest_id_[w] = next_id;
      const std::string id = absl::StrCat("w", w, "-", next_id++);
      const absl::Status s = store_->CreateSequence(id, prefix);
      // A dyn prefix may be released or evicted right now; the anchored ones never are.
      if (s.code() == absl::StatusCode::kNotFound && prefix.starts_with("dyn")) continue;
      ASSERT_TRUE(s.ok()) << s;
      expected[id] = PrefixRows(prefix);
    } else if (choice <= 4) {  // append
      const std::string id = pick();
      const int layer = std::uniform_int_distribution<int>(0, kStressLayers - 1)(rng);
      std::vector<Bf16>& rows = expected[id][layer];
      const int64_t position = static_cast<int64_t>(rows.size()) / width_;
      if (position >= kMaxLength) {
        release(id);
        continue;
      }
      const int n = std::uniform_int_distribution<int>(1, 9)(rng);
      const std::vector<Bf16> fresh = Rows(next_tag++, position, n, width_);
      const absl::Status s = store_->Append(id, layer, position, View2(fresh, width_));
      if (s.code() == absl::StatusCode::kResourceExhausted) {
        ++exhausted_;
        release(pick());  // make room; the failed append must have changed nothing
        continue;
      }
      ASSERT_TRUE(s.ok()) << s;
      rows.insert(rows.end(), fresh.begin(), fresh.end());
      if (choice == 4) {  // the client did not hear back and retries
        ASSERT_TRUE(store_->Append(id, layer, position, View2(fresh, width_)).ok());
      }
    } else if (choice == 5 && expected.size() < kMaxSequencesPerWorker) {  // fork
      const std::string source = pick();
      latest_id_[w] = next_id;
      const std::string id = absl::StrCat("w", w, "-", next_id++);
      ASSERT_TRUE(store_->ForkSequence(source, id).ok());
      expected[id] = expected[source];
    } else if (choice <= 7) {  // snapshot and check
      const std::string id = pick();
      const int layer = std::uniform_int_distribution<int>(0, kStressLayers - 1)(rng);
      absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot(id, layer);
      ASSERT_TRUE(snapshot.ok()) << snapshot.status();
      verify(*snapshot, expected[id][layer]);
    } else if (choice == 8) {  // a snapshot outlives its sequence while others write
      const std::string id = pick();
      const std::vector<Bf16> rows = expected[id][0];
      absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot(id, 0);
      ASSERT_TRUE(snapshot.ok()) << snapshot.status();
      release(id);
      if (!expected.empty()) {
        const std::string other = pick();
        std::vector<Bf16>& other_rows = expected[other][0];
        const int64_t position = static_cast<int64_t>(other_rows.size()) / width_;
        const std::vector<Bf16> fresh = Rows(next_tag++, position, kPageSize, width_);
        if (store_->Append(other, 0, position, View2(fresh, width_)).ok()) {
          other_rows.insert(other_rows.end(), fresh.begin(), fresh.end());
        }
      }
      verify(*snapshot, rows);
    } else {
      release(pick());
    }
  }
  for (const auto& [id, layers] : expected) {
    for (int layer = 0; layer < kStressLayers; ++layer) {
      absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot(id, layer);
      ASSERT_TRUE(snapshot.ok());
      verify(*snapshot, layers[layer]);
    }
  }
  for (const auto& [id, layers] : expected) ASSERT_TRUE(store_->ReleaseSequence(id).ok());
}

// Registers and releases the dynamic prefixes and uses expansions, checking them against
// ExpandHeadKv on the known rows.
void StressTest::PrefixChurn() {
  std::mt19937 rng(99);
  std::vector<std::vector<Bf16>> reference_k(kStressLayers), reference_v(kStressLayers);  // head 1
  for (int layer = 0; layer < kStressLayers; ++layer) {
    const std::vector<Bf16> rows = prefixes_.sys.Layer(layer);
    std::vector<float> latent(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) latent[i] = rows[i].ToFloat();
    reference_k[layer].resize(10 * model_.dqk());
    reference_v[layer].resize(10 * model_.dv);
    ExpandHeadKv(latent.data(), width_, 10, model_.dr, weights_->Layer(layer), 1,
                 reference_k[layer].data(), reference_v[layer].data());
  }
  while (!workers_done_) {
    const int k = std::uniform_int_distribution<int>(0, 3)(rng);
    const std::string id = absl::StrCat("dyn", k);
    switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
      case 0: {
        const absl::Status s = store_->RegisterPrefix(id, "", prefixes_.dynamic[k].View());
        ASSERT_TRUE(s.ok() || s.code() == absl::StatusCode::kResourceExhausted) << s;
        break;
      }
      case 1:
        ASSERT_TRUE(store_->ReleasePrefix(id).ok());
        break;
      case 2: {
        const int layer = std::uniform_int_distribution<int>(0, kStressLayers - 1)(rng);
        absl::StatusOr<ExpandedKv> expanded =
            store_->GetOrBuildExpanded(sys_key_, layer, *weights_);
        if (expanded.status().code() == absl::StatusCode::kResourceExhausted) break;
        ASSERT_TRUE(expanded.ok()) << expanded.status();
        const HeadKv head = expanded->Head(1);
        ASSERT_EQ(head.length, 10);
        for (int i = 0; i < 10 * model_.dqk(); ++i) ASSERT_EQ(head.k[i], reference_k[layer][i]);
        for (int i = 0; i < 10 * model_.dv; ++i) ASSERT_EQ(head.v[i], reference_v[layer][i]);
        break;
      }
      default: {
        const absl::StatusOr<PrefixInfo> info = store_->GetPrefix(id);
        if (!info.ok()) break;
        // May be released (and freed) between the two calls: then NOT_FOUND is right.
        const absl::StatusOr<ExpandedKv> expanded =
            store_->GetOrBuildExpanded(info->key, 0, *weights_);
        ASSERT_TRUE(expanded.ok() || expanded.status().code() == absl::StatusCode::kNotFound ||
                    expanded.status().code() == absl::StatusCode::kResourceExhausted)
            << expanded.status();
        break;
      }
    }
  }
}

// A planner's view: snapshots other threads' sequences in batches and checks what it can
// know without their bookkeeping: the tables are valid and a shared prefix's rows never
// change, whatever copy-on-write appends happen around them. It also forks other threads'
// sequences (possibly while they are being appended to) and writes to the forks, which the
// owners' checks must never notice.
void StressTest::Reader() {
  std::mt19937 rng(7);
  const std::vector<Bf16> sys_rows = prefixes_.sys.Layer(1);
  int forks = 0;
  while (!workers_done_) {
    std::vector<std::string> batch;
    for (int i = 0; i < 2; ++i) {
      const int w = std::uniform_int_distribution<int>(0, kWorkers - 1)(rng);
      const int recent = latest_id_[w] - std::uniform_int_distribution<int>(0, 3)(rng);
      batch.push_back(absl::StrCat("w", w, "-", recent));
    }
    absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot(batch, 1);
    if (snapshot.ok()) {
      ASSERT_TRUE(ValidatePagedSequences(snapshot->cache(), snapshot->tables()).ok());
      for (int b = 0; b < snapshot->batch(); ++b) {
        const SequenceSnapshot& seq = snapshot->sequence(b);
        if (seq.prefixes.empty() || seq.prefixes[0].key != sys_key_) continue;
        const std::vector<Bf16> rows = ReadSequence(*snapshot, b);
        ASSERT_GE(rows.size(), sys_rows.size());
        ASSERT_TRUE(std::equal(sys_rows.begin(), sys_rows.end(), rows.begin())) << seq.id;
        ++snapshots_checked_;
      }
    } else {
      ASSERT_EQ(snapshot.status().code(), absl::StatusCode::kNotFound) << snapshot.status();
    }

    const std::string fork = absl::StrCat("r-", forks++);
    const absl::Status forked = store_->ForkSequence(batch[0], fork);
    if (forked.code() == absl::StatusCode::kNotFound) continue;
    ASSERT_TRUE(forked.ok()) << forked;
    absl::StatusOr<KvSnapshot> before = store_->Snapshot(fork, 0);
    ASSERT_TRUE(before.ok());
    std::vector<Bf16> rows = ReadSequence(*before, 0);
    const int64_t position = before->sequence(0).length;
    const std::vector<Bf16> fresh = Rows(~uint64_t{0} - forks, position, 3, width_);
    const absl::Status appended = store_->Append(fork, 0, position, View2(fresh, width_));
    if (appended.ok()) {
      rows.insert(rows.end(), fresh.begin(), fresh.end());
    } else {
      ASSERT_EQ(appended.code(), absl::StatusCode::kResourceExhausted) << appended;
    }
    absl::StatusOr<KvSnapshot> after = store_->Snapshot(fork, 0);
    ASSERT_TRUE(after.ok());
    ASSERT_EQ(ReadSequence(*after, 0), rows);
    ASSERT_TRUE(store_->ReleaseSequence(fork).ok());
  }
}

TEST_F(StressTest, ConcurrentClientsNeverSeeEachOthersRowsOrLoseTheirOwn) {
  std::thread churn([this] { PrefixChurn(); });
  std::thread reader([this] { Reader(); });
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) workers.emplace_back([this, w] { Worker(w); });
  for (std::thread& t : workers) t.join();
  workers_done_ = true;
  churn.join();
  reader.join();

  EXPECT_GT(snapshots_checked_.load(), 100);
  ASSERT_TRUE(store_->ReleaseSequence("anchor").ok());
  const KvStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.sequences, 0);
  EXPECT_EQ(stats.pages_sequence, 0);
  EXPECT_EQ(stats.pages_pinned, 0);
  // Only prefixes remain: dropping them empties the pool, so nothing leaked.
  for (const char* id : {"sys/a", "sys", "dyn0", "dyn1", "dyn2", "dyn3"}) {
    ASSERT_TRUE(store_->ReleasePrefix(id).ok());
  }
  const KvStoreStats empty = store_->Stats();
  EXPECT_EQ(empty.pages_used, 0);
  EXPECT_EQ(empty.used_bytes, 0);
  EXPECT_EQ(empty.retained_prefixes, 0);
  std::printf(
      "snapshots checked %d, appends refused for memory %d, prefix evictions %ld, "
      "expansion evictions %ld\n",
      snapshots_checked_.load(), exhausted_.load(), static_cast<long>(stats.prefix_evictions),
      static_cast<long>(stats.expanded_evictions));
}

}  // namespace
}  // namespace mlaserve::engine
