#ifndef MLASERVE_TESTS_SERVER_ENGINE_KV_KV_STORE_FIXTURE_H_
#define MLASERVE_TESTS_SERVER_ENGINE_KV_KV_STORE_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/engine/kv/kv_store.h"
#include "tests/server/engine/kv/kv_store_test_util.h"

namespace mlaserve::engine::testing {

// A store of TinyModel's widths in 4-token pages, `pages` pages of budget (64 by default),
// with helpers to append tagged rows and read a sequence back: what the KvStore test files
// share.
inline constexpr int64_t kStorePageBytes = kPageSize * kWidth * 2;  // 160

class KvStoreTest : public ::testing::Test {
 protected:
  void MakeStore(int64_t pages, int layers = 3) {
    model_ = TinyModel(layers);
    absl::StatusOr<std::unique_ptr<KvStore>> store = KvStore::Create(
        model_, KvStoreOptions{.budget_bytes = pages * kStorePageBytes, .page_size = kPageSize});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void SetUp() override { MakeStore(64); }

  // Appends Rows(tag, position, n) to one layer; returns the rows.
  std::vector<Bf16> Append(const std::string& id, int layer, int64_t position, int64_t n,
                           uint64_t tag) {
    std::vector<Bf16> rows = Rows(tag, position, n, kWidth);
    const absl::Status s = store_->Append(id, layer, position, View2(rows, kWidth));
    EXPECT_TRUE(s.ok()) << s;
    return rows;
  }

  std::vector<Bf16> Read(const std::string& id, int layer) {
    absl::StatusOr<KvSnapshot> snapshot = store_->Snapshot(id, layer);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    return snapshot.ok() ? ReadSequence(*snapshot, 0) : std::vector<Bf16>{};
  }

  ModelConfig model_;
  std::unique_ptr<KvStore> store_;
};

}  // namespace mlaserve::engine::testing

#endif  // MLASERVE_TESTS_SERVER_ENGINE_KV_KV_STORE_FIXTURE_H_
