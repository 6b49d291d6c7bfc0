#include "kernels/gpu/host_mappings.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve::gpu {
namespace {

TEST(HostMappingsTest, ARangeIsFoundWholeOnlyWhileItsHandleIsHeld) {
  auto mappings = std::make_shared<HostMappings>();
  std::vector<char> memory(4096);
  int released = 0;
  std::shared_ptr<void> handle =
      mappings->Add(memory.data() + 1024, 1024, [&released] { ++released; });
  EXPECT_TRUE(mappings->Contains(memory.data() + 1024, 1024));
  EXPECT_TRUE(mappings->Contains(memory.data() + 1500, 100));
  EXPECT_TRUE(mappings->Contains(memory.data() + 2047, 1));
  EXPECT_FALSE(mappings->Contains(memory.data() + 1023, 2));   // starts before it
  EXPECT_FALSE(mappings->Contains(memory.data() + 2000, 49));  // ends after it
  EXPECT_FALSE(mappings->Contains(memory.data() + 2048, 1));
  EXPECT_FALSE(mappings->Contains(memory.data(), 16));
  std::shared_ptr<void> copy = handle;
  handle.reset();
  EXPECT_EQ(released, 0);
  EXPECT_TRUE(mappings->Contains(memory.data() + 1024, 1024));
  copy.reset();
  EXPECT_EQ(released, 1);
  EXPECT_FALSE(mappings->Contains(memory.data() + 1024, 1024));
}

TEST(HostMappingsTest, TwoRangesSideBySideAreNotOneRange) {
  auto mappings = std::make_shared<HostMappings>();
  std::vector<char> memory(4096);
  auto a = mappings->Add(memory.data(), 1024, [] {});
  auto b = mappings->Add(memory.data() + 1024, 1024, [] {});
  EXPECT_TRUE(mappings->Contains(memory.data() + 1000, 24));
  EXPECT_TRUE(mappings->Contains(memory.data() + 1024, 24));
  EXPECT_FALSE(mappings->Contains(memory.data() + 1000, 48));  // spans both
  a.reset();
  EXPECT_FALSE(mappings->Contains(memory.data(), 1));
  EXPECT_TRUE(mappings->Contains(memory.data() + 1024, 1024));
}

// A handle may outlive the runtime that made it (a data plane's client leaving after the
// engine): it keeps the registry it came from.
TEST(HostMappingsTest, AHandleOutlivesItsOwner) {
  std::vector<char> memory(64);
  bool released = false;
  std::shared_ptr<void> handle;
  {
    auto mappings = std::make_shared<HostMappings>();
    handle = mappings->Add(memory.data(), 64, [&released] { released = true; });
  }
  handle.reset();
  EXPECT_TRUE(released);
}

TEST(HostMappingsTest, RegistrationsFromManyThreadsWhileLookingUp) {
  auto mappings = std::make_shared<HostMappings>();
  std::vector<char> memory(64 * 1024);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        char* at = memory.data() + (t * 16 + i % 16) * 256;
        auto handle = mappings->Add(at, 256, [] {});
        EXPECT_TRUE(mappings->Contains(at, 256));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_FALSE(mappings->Contains(memory.data(), 1));
}

}  // namespace
}  // namespace mlaserve::gpu
