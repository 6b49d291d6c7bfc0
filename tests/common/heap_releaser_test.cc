#include "common/heap_releaser.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "common/heap_usage.h"
#include "gtest/gtest.h"

namespace mlaserve {
namespace {

// VmRSS of this process in bytes, from /proc/self/status.
double ResidentBytes() {
  std::ifstream in("/proc/self/status");
  const std::string status((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = status.find("VmRSS:");
  if (at == std::string::npos) return -1;
  const size_t end = status.find('\n', at);
  std::string field = status.substr(at + 6, end - at - 6);
  field = field.substr(field.find_first_not_of(" \t"));
  double kib = 0;
  if (!absl::SimpleAtod(field.substr(0, field.find(' ')), &kib)) return -1;
  return kib * 1024;
}

// Blocks below the mmap threshold stay in an arena when freed; freeing all but every tenth
// strands free memory between live blocks, which trimming the heap's top cannot return.
TEST(HeapReleaserTest, ReleaseNowReturnsFreedPagesBetweenLiveBlocks) {
  if (!ReadHeapUsage().has_value()) GTEST_SKIP() << "a sanitizer's allocator serves malloc";
  constexpr size_t kBlockBytes = 64 << 10;
  constexpr int kBlocks = 1024;  // 64 MiB
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    blocks.emplace_back(new char[kBlockBytes]);
    std::fill_n(blocks.back().get(), kBlockBytes, static_cast<char>(i));
  }
  for (int i = 0; i < kBlocks; ++i) {
    if (i % 10 != 9) blocks[i].reset();
  }
  const double freed = kBlockBytes * (kBlocks - kBlocks / 10);
  const double before = ResidentBytes();
  HeapReleaser::ReleaseNow();
  const double after = ResidentBytes();
  EXPECT_GT(before - after, freed / 2) << "RSS " << before << " -> " << after;
  for (int i = 9; i < kBlocks; i += 10) EXPECT_EQ(blocks[i][0], static_cast<char>(i));
}

TEST(HeapReleaserTest, ReportsEachPeriodicReleaseAndStopsWhenDestroyed) {
  absl::Mutex mu;
  int releases = 0;
  {
    HeapReleaser releaser(absl::Milliseconds(5), [&](absl::Duration took) {
      EXPECT_GE(took, absl::ZeroDuration());
      absl::MutexLock lock(&mu);
      ++releases;
    });
    // Released before the releaser is destroyed: its thread takes `mu` to report.
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* n) { return *n >= 3; }, &releases),
                                    absl::Seconds(30)));
  }
  int at_destruction = 0;
  {
    absl::MutexLock lock(&mu);
    at_destruction = releases;
  }
  absl::SleepFor(absl::Milliseconds(50));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(releases, at_destruction);
}

TEST(HeapUsageTest, CountsALiveBlockAsInUseAndAFreedOneNoLonger) {
  const std::optional<HeapUsage> start = ReadHeapUsage();
  if (!start.has_value()) GTEST_SKIP() << "a sanitizer's allocator serves malloc";
  constexpr size_t kBytes = 8 << 20;
  auto block = std::make_unique<char[]>(kBytes);
  const HeapUsage held = *ReadHeapUsage();
  EXPECT_GE(held.in_use_bytes - start->in_use_bytes, kBytes);
  block.reset();
  const HeapUsage after = *ReadHeapUsage();
  EXPECT_LE(after.in_use_bytes, held.in_use_bytes - kBytes);
}

}  // namespace
}  // namespace mlaserve
