// KvStore::Checkpoint and KvStore::Restore: a store brought back from its checkpoint holds
// every prefix and sequence bit for bit, with its sharing, formats and retry identities; a
// manifest that does not hold together restores nothing.

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/kv/kv_store.h"
#include "tests/server/engine/kv/kv_store_test_util.h"

namespace mlaserve::engine {
namespace {

using testing::Fp8Records;
using ::testing::HasSubstr;
using testing::kPageSize;
using testing::Latent;
using testing::ReadFp8Sequence;
using testing::ReadSequence;
using testing::Rows;
using testing::TinyModel;
using testing::View2;

std::unique_ptr<KvStore> MakeStore(int64_t pages = 256) {
  const ModelConfig model = TinyModel();
  KvStoreOptions options;
  options.page_size = kPageSize;
  options.budget_bytes = pages * kPageSize * model.dk_latent() * 2;
  return *KvStore::Create(model, options);
}

// Restores `checkpoint` into `store`, reading the pages through the checkpoint itself.
absl::Status RestoreFrom(const KvCheckpoint& checkpoint, KvStore& store) {
  return store.Restore(checkpoint.manifest(), [&](int32_t index, std::span<std::byte> out) {
    checkpoint.ReadPage(index, out);
    return absl::OkStatus();
  });
}

// What a sequence layer reads, in its format's bytes.
std::vector<std::byte> Contents(KvStore& store, const std::string& id, int layer) {
  absl::StatusOr<KvSnapshot> snapshot = store.Snapshot(id, layer);
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  if (snapshot->sequence(0).kv_dtype == KvDtype::kFp8) return ReadFp8Sequence(*snapshot, 0);
  const std::vector<Bf16> rows = ReadSequence(*snapshot, 0);
  std::vector<std::byte> bytes(rows.size() * sizeof(Bf16));
  std::memcpy(bytes.data(), rows.data(), bytes.size());
  return bytes;
}

void Append(KvStore& store, const std::string& id, int layer, int64_t at, int64_t n, uint64_t tag) {
  const int width = store.model().dk_latent();
  const std::vector<Bf16> rows = Rows(tag, at, n, width);
  ASSERT_TRUE(store.Append(id, layer, at, View2(rows, width)).ok());
}

// A store with a bit of everything: a prefix tree (root, child), a released prefix kept
// alive by its sequence, sequences on prefixes and on none, forks that share a partly filled
// page, layers of different lengths, and an FP8 prefix with its sequence.
class KvStoreStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = MakeStore();
    const ModelConfig& m = store_->model();
    const int width = m.dk_latent();
    const Latent root(1, m.layers, 0, 6, width);
    const Latent child(2, m.layers, 6, 5, width);
    const Latent released(3, m.layers, 0, 3, width);
    const Latent fp8(4, m.layers, 0, 9, width);
    ASSERT_TRUE(store_->RegisterPrefix("root", "", root.View()).ok());
    ASSERT_TRUE(store_->RegisterPrefix("child", "root", child.View()).ok());
    ASSERT_TRUE(store_->RegisterPrefix("gone", "", released.View()).ok());
    ASSERT_TRUE(store_->RegisterPrefix("p8", "", fp8.View(), KvDtype::kFp8).ok());
    ASSERT_TRUE(store_->CreateSequence("on-root", "root").ok());
    ASSERT_TRUE(store_->CreateSequence("on-child", "child").ok());
    ASSERT_TRUE(store_->CreateSequence("on-gone", "gone").ok());
    ASSERT_TRUE(store_->ReleasePrefix("gone").ok());
    ASSERT_TRUE(store_->CreateSequence("bare", "").ok());
    ASSERT_TRUE(store_->CreateSequence("s8", "p8").ok());
    for (int layer = 0; layer < m.layers; ++layer) {
      Append(*store_, "on-root", layer, 6, 3 + layer, 10 + layer);
      Append(*store_, "bare", layer, 0, 5 + 2 * layer, 20 + layer);
      Append(*store_, "on-gone", layer, 3, 1, 30 + layer);
      const std::vector<Bf16> rows = Rows(40 + layer, 9, 2, width);
      ASSERT_TRUE(store_->AppendFp8("s8", layer, 9, Fp8Records(rows, m.dl, m.dr), 2).ok());
    }
    // Shares bare's partly filled last pages until either side appends.
    ASSERT_TRUE(store_->ForkSequence("bare", "bare-fork").ok());
  }

  std::vector<std::string> Ids() const {
    return {"on-root", "on-child", "on-gone", "bare", "bare-fork", "s8"};
  }

  std::unique_ptr<KvStore> store_;
};

TEST_F(KvStoreStateTest, RestoredStoreHoldsEverySequenceBitForBit) {
  auto restored = MakeStore();
  {
    const KvCheckpoint checkpoint = store_->Checkpoint();
    ASSERT_TRUE(RestoreFrom(checkpoint, *restored).ok());
  }
  for (const std::string& id : Ids()) {
    SCOPED_TRACE(id);
    absl::StatusOr<SequenceInfo> before = store_->GetSequence(id);
    absl::StatusOr<SequenceInfo> after = restored->GetSequence(id);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(*after, *before);
    for (int layer = 0; layer < store_->model().layers; ++layer) {
      EXPECT_EQ(Contents(*restored, id, layer), Contents(*store_, id, layer));
    }
  }
  // Prefixes: the registered ones by id, with their tree; the released one is gone by id.
  for (const char* id : {"root", "child", "p8"}) {
    absl::StatusOr<PrefixInfo> before = store_->GetPrefix(id);
    absl::StatusOr<PrefixInfo> after = restored->GetPrefix(id);
    ASSERT_TRUE(after.ok()) << id << ": " << after.status();
    EXPECT_EQ(after->parent_id, before->parent_id);
    EXPECT_EQ(after->begin, before->begin);
    EXPECT_EQ(after->end, before->end);
    EXPECT_EQ(after->kv_dtype, before->kv_dtype);
  }
  EXPECT_TRUE(absl::IsNotFound(restored->GetPrefix("gone").status()));
  // Shared pages stay shared: the same pages in use, by the same kinds of holder.
  const KvStoreStats a = store_->Stats();
  const KvStoreStats b = restored->Stats();
  EXPECT_EQ(b.pages_used, a.pages_used);
  EXPECT_EQ(b.pages_prefix, a.pages_prefix);
  EXPECT_EQ(b.pages_sequence, a.pages_sequence);
  EXPECT_EQ(b.prefixes, a.prefixes);
  EXPECT_EQ(b.retained_prefixes, a.retained_prefixes);
  EXPECT_EQ(b.sequences, a.sequences);
  EXPECT_EQ(b.pages_pinned, 0);
}

TEST_F(KvStoreStateTest, RestoredStoreBehavesAsTheOriginal) {
  auto restored = MakeStore();
  {
    const KvCheckpoint checkpoint = store_->Checkpoint();
    ASSERT_TRUE(RestoreFrom(checkpoint, *restored).ok());
  }
  // Retries are recognised as before: a repeated create, fork and registration succeed.
  EXPECT_TRUE(restored->CreateSequence("on-root", "root").ok());
  EXPECT_TRUE(restored->ForkSequence("bare", "bare-fork").ok());
  const Latent root(1, store_->model().layers, 0, 6, store_->model().dk_latent());
  EXPECT_TRUE(restored->RegisterPrefix("root", "", root.View()).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(restored->CreateSequence("on-root", "child")));
  // Copy-on-write still holds: an append to the fork leaves its source as it was, on both.
  for (KvStore* store : {store_.get(), restored.get()}) {
    Append(*store, "bare-fork", 0, 5, 2, 99);
  }
  EXPECT_EQ(Contents(*restored, "bare", 0), Contents(*store_, "bare", 0));
  EXPECT_EQ(Contents(*restored, "bare-fork", 0), Contents(*store_, "bare-fork", 0));
  EXPECT_NE(Contents(*restored, "bare-fork", 0), Contents(*restored, "bare", 0));
  // Releasing everything frees every page: the restored references add up.
  for (const std::string& id : Ids()) ASSERT_TRUE(restored->ReleaseSequence(id).ok());
  for (const char* id : {"root", "child", "p8"}) ASSERT_TRUE(restored->ReleasePrefix(id).ok());
  EXPECT_EQ(restored->Stats().pages_used, 0);
  EXPECT_EQ(restored->Stats().retained_prefixes, 0);
}

TEST_F(KvStoreStateTest, CheckpointPinsItsPagesUntilItGoes) {
  auto checkpoint = std::make_unique<KvCheckpoint>(store_->Checkpoint());
  const std::vector<std::byte> bare = Contents(*store_, "bare", 1);
  ASSERT_TRUE(store_->ReleaseSequence("bare").ok());
  ASSERT_TRUE(store_->ReleaseSequence("bare-fork").ok());
  EXPECT_GT(store_->Stats().pages_pinned, 0);
  auto restored = MakeStore();
  ASSERT_TRUE(RestoreFrom(*checkpoint, *restored).ok());
  EXPECT_EQ(Contents(*restored, "bare", 1), bare);
  checkpoint.reset();
  EXPECT_EQ(store_->Stats().pages_pinned, 0);
}

TEST_F(KvStoreStateTest, RestoreNeedsAnEmptyStoreAndLeavesItEmptyOnFailure) {
  const KvCheckpoint checkpoint = store_->Checkpoint();
  EXPECT_TRUE(absl::IsFailedPrecondition(RestoreFrom(checkpoint, *store_)));

  auto restored = MakeStore();
  const absl::Status failed =
      restored->Restore(checkpoint.manifest(), [](int32_t index, std::span<std::byte>) {
        return index < 3 ? absl::OkStatus() : absl::DataLossError("the disk went away");
      });
  EXPECT_TRUE(absl::IsDataLoss(failed)) << failed;
  KvStoreStats after = restored->Stats();
  // Pages written before the failure stay resident (the pool keeps what was written); that
  // memory is all the failed restore leaves behind.
  after.pages_touched = 0;
  EXPECT_EQ(after, MakeStore()->Stats());
  // Still empty, so a good restore works after the failed one.
  EXPECT_TRUE(RestoreFrom(checkpoint, *restored).ok());

  auto small = MakeStore(/*pages=*/4);
  EXPECT_TRUE(absl::IsResourceExhausted(RestoreFrom(checkpoint, *small)));
  EXPECT_EQ(small->Stats().pages_used, 0);
}

// Every way a manifest can fail to hold together is refused before anything is touched.
TEST_F(KvStoreStateTest, ManifestsThatDoNotHoldTogetherRestoreNothing) {
  const KvCheckpoint checkpoint = store_->Checkpoint();
  const KvStateManifest good = checkpoint.manifest();
  ASSERT_EQ(good.prefixes.size(), 4u);  // root, child, gone, p8: in registration order
  ASSERT_EQ(good.prefixes[3].id, "p8");
  struct Case {
    const char* name;
    void (*corrupt)(KvStateManifest&);
    const char* message;
  };
  const Case cases[] = {
      {"other layers", [](KvStateManifest& m) { ++m.layers; }, "layers"},
      {"other page size", [](KvStateManifest& m) { m.page_size *= 2; }, "pages"},
      {"page index out of range",
       [](KvStateManifest& m) {
         m.sequences[0].pages[0][0] = static_cast<int32_t>(m.pages.size());
       },
       "outside the saved pages"},
      {"negative page index", [](KvStateManifest& m) { m.prefixes[0].pages[1][0] = -1; },
       "outside the saved pages"},
      {"length past its pages", [](KvStateManifest& m) { m.sequences[0].lengths[0] += 100; },
       "pages for"},
      {"page holding too few tokens", [](KvStateManifest& m) { m.pages[0].tokens = 1; }, "reads"},
      {"page of another format",
       [](KvStateManifest& m) {
         m.pages[0].kv_dtype =
             m.pages[0].kv_dtype == KvDtype::kFp8 ? KvDtype::kBf16 : KvDtype::kFp8;
       },
       ""},
      {"unknown format",
       [](KvStateManifest& m) { m.sequences[0].kv_dtype = static_cast<KvDtype>(7); }, "format"},
      {"empty id", [](KvStateManifest& m) { m.sequences[0].id.clear(); }, "sequences[0].id"},
      {"id twice", [](KvStateManifest& m) { m.sequences[1].id = m.sequences[0].id; }, "repeats"},
      {"prefix registered twice", [](KvStateManifest& m) { m.prefixes[3].id = m.prefixes[0].id; },
       "twice"},
      {"parent after its child", [](KvStateManifest& m) { m.prefixes[0].parent = 1; },
       "not an earlier prefix"},
      {"prefix out of range", [](KvStateManifest& m) { m.sequences[0].prefix = 1000; },
       "outside the saved prefixes"},
      {"sequence shorter than its prefix",
       [](KvStateManifest& m) {
         for (auto& s : m.sequences) {
           if (s.prefix >= 0) {
             s.lengths[0] = 0;
             s.pages[0].clear();
             return;
           }
         }
       },
       "fewer than its prefix"},
      {"released prefix nobody references",
       [](KvStateManifest& m) {
         m.prefixes[3].registered = false;  // p8: only s8 references it
         for (auto& s : m.sequences) {
           if (s.prefix == 3) s.prefix = -1;
         }
       },
       "nothing references it"},
      {"page nobody holds",
       [](KvStateManifest& m) {
         m.pages.push_back({KvDtype::kBf16, 1});
       },
       "in no page list"},
      {"child that does not continue its parent",
       [](KvStateManifest& m) { m.prefixes[1].begin = 2; }, "parent"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    KvStateManifest bad = good;
    c.corrupt(bad);
    auto restored = MakeStore();
    int reads = 0;
    const absl::Status status =
        restored->Restore(bad, [&](int32_t index, std::span<std::byte> out) {
          ++reads;
          checkpoint.ReadPage(index, out);
          return absl::OkStatus();
        });
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
    EXPECT_EQ(reads, 0);
    EXPECT_EQ(restored->Stats(), MakeStore()->Stats());
  }
}

// A checkpoint taken while appends, forks and releases run is a state the store was in:
// every saved sequence layer holds exactly the rows its length says, as appended.
TEST(KvStoreStateConcurrencyTest, CheckpointsWhileTheStoreChanges) {
  auto store = MakeStore(4096);
  const ModelConfig& m = store->model();
  const int width = m.dk_latent();
  constexpr int kWriters = 2;
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int round = 0; !stop.load(); ++round) {
        const std::string id = absl::StrCat("w", w, "-", round % 4);
        ASSERT_TRUE(store->ReleaseSequence(id).ok());
        ASSERT_TRUE(store->CreateSequence(id, "").ok());
        for (int64_t at = 0; at < 10; ++at) {
          for (int layer = 0; layer < m.layers; ++layer) {
            // The rows depend on the sequence's id only, so any prefix of them is checkable.
            const std::vector<Bf16> rows = Rows(w * 100 + round % 4, at, 1, width);
            ASSERT_TRUE(store->Append(id, layer, at, View2(rows, width)).ok());
          }
        }
      }
    });
  }
  for (int i = 0; i < 50; ++i) {
    const KvCheckpoint checkpoint = store->Checkpoint();
    auto restored = MakeStore(4096);
    ASSERT_TRUE(RestoreFrom(checkpoint, *restored).ok());
    for (const KvStateManifest::Sequence& s : checkpoint.manifest().sequences) {
      const int w = s.id[1] - '0';
      const int slot = s.id.back() - '0';
      for (int layer = 0; layer < m.layers; ++layer) {
        if (s.lengths[layer] == 0) continue;
        absl::StatusOr<KvSnapshot> snapshot = restored->Snapshot(s.id, layer);
        ASSERT_TRUE(snapshot.ok());
        EXPECT_EQ(ReadSequence(*snapshot, 0), Rows(w * 100 + slot, 0, s.lengths[layer], width))
            << s.id << " layer " << layer;
      }
    }
  }
  stop = true;
  for (std::thread& t : writers) t.join();
}

}  // namespace
}  // namespace mlaserve::engine
