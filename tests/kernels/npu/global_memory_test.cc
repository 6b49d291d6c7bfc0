// GlobalMemory's machinery: released host memory reused without handing out a live buffer's,
// and atomic guards over wrapping stripe ranges.
#include "kernels/npu/global_memory.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve::npu {
namespace {

TEST(GlobalMemoryTest, AReleasedBuffersHostMemoryServesTheNextAllocationOfItsSize) {
  GlobalMemory gm(1 << 30, 512);
  auto a = gm.Allocate(1 << 20, true, "a");
  ASSERT_TRUE(a.ok());
  std::byte* const host = a->host;
  gm.Release(*a);
  EXPECT_EQ(gm.spare_host_bytes(), 1 << 20);
  auto unbacked = gm.Allocate(1 << 20, false, "addresses only");
  ASSERT_TRUE(unbacked.ok());
  EXPECT_EQ(unbacked->host, nullptr);
  EXPECT_EQ(gm.spare_host_bytes(), 1 << 20);  // not taken by an unbacked buffer
  auto tiny = gm.Allocate(1000, true, "much smaller");
  ASSERT_TRUE(tiny.ok());
  EXPECT_NE(tiny->host, host);  // would waste most of the spare
  auto b = gm.Allocate((1 << 20) - 4096, true, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, host);
  EXPECT_EQ(gm.spare_host_bytes(), 0);
  auto c = gm.Allocate(1 << 20, true, "c");
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->host, host);  // b still holds it
}

TEST(GlobalMemoryTest, ReuseNeverHandsOutALiveBuffersMemoryAndKeepsAtMostThePeak) {
  GlobalMemory gm(int64_t{1} << 32, 512);
  std::mt19937_64 rng(7);
  struct Held {
    GmBuffer buffer;
    uint8_t pattern;
  };
  std::vector<Held> live;
  int64_t live_bytes = 0, peak = 0;
  auto intact = [](const Held& h) {
    for (int64_t i = 0; i < h.buffer.bytes; i += 61) {
      if (h.buffer.host[i] != std::byte{h.pattern}) return false;
    }
    return h.buffer.host[h.buffer.bytes - 1] == std::byte{h.pattern};
  };
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || rng() % 5 < 3) {
      // A handful of recurring sizes and some odd ones, as batches allocate.
      const int64_t sizes[] = {4096, 65536, 200000, 1 << 20};
      const int64_t bytes =
          rng() % 4 == 0 ? static_cast<int64_t>(1 + rng() % 300000) : sizes[rng() % 4];
      auto b = gm.Allocate(bytes, true, "buffer");
      ASSERT_TRUE(b.ok()) << b.status();
      for (const Held& h : live) {
        const bool disjoint =
            b->host + b->bytes <= h.buffer.host || h.buffer.host + h.buffer.bytes <= b->host;
        ASSERT_TRUE(disjoint) << "step " << step
                              << ": a live buffer's host memory handed out again";
      }
      const auto pattern = static_cast<uint8_t>(step);
      std::memset(b->host, pattern, static_cast<size_t>(bytes));
      live.push_back({*b, pattern});
      live_bytes += bytes;
      peak = std::max(peak, live_bytes);
    } else {
      const size_t k = rng() % live.size();
      ASSERT_TRUE(intact(live[k])) << "step " << step << ": a live buffer was overwritten";
      gm.Release(live[k].buffer);
      live_bytes -= live[k].buffer.bytes;
      live[k] = live.back();
      live.pop_back();
    }
    // Reused backings may be up to twice their buffer's size.
    ASSERT_LE(gm.spare_host_bytes(), 2 * peak);
  }
  for (const Held& h : live) EXPECT_TRUE(intact(h));
}

TEST(GlobalMemoryTest, AtomicGuardsOverWrappingStripeRangesExcludeEachOtherWithoutDeadlock) {
  GlobalMemory gm(int64_t{1} << 36, 512);
  // Stripes are 16 KiB of address space, 1024 of them, reused modulo 1024. These ranges share
  // stripe 0 (address 16 MiB); the first three wrap from the last stripes round to the first
  // ones, the last covers every stripe.
  constexpr uint64_t kStripe = 16 << 10, kStripes = 1024;
  std::vector<std::pair<uint64_t, int64_t>> ranges = {{(kStripes - 2) * kStripe, 4 * kStripe},
                                                      {(kStripes - 1) * kStripe + 100, 2 * kStripe},
                                                      {(kStripes - 20) * kStripe, 40 * kStripe},
                                                      {kStripes * kStripe, 64}};
#if !defined(__SANITIZE_THREAD__)  // ThreadSanitizer tracks at most 64 locks held at once
  ranges.push_back({kStripe / 2, (kStripes + 5) * kStripe});
#endif
  std::atomic<int> counter{0};
  constexpr int kRounds = 3000;
  std::vector<std::thread> threads;
  for (const auto& range : ranges) {
    // Named copies: clang 14 (the asan preset) cannot capture structured bindings.
    threads.emplace_back([&gm, &counter, addr = range.first, bytes = range.second] {
      for (int i = 0; i < kRounds; ++i) {
        GlobalMemory::AtomicGuard guard(gm, addr, bytes);
        // A read-modify-write in two steps: only mutual exclusion keeps every increment.
        const int v = counter.load(std::memory_order_relaxed);
        std::this_thread::yield();
        counter.store(v + 1, std::memory_order_relaxed);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter.load(), static_cast<int>(ranges.size()) * kRounds);
}

}  // namespace
}  // namespace mlaserve::npu
