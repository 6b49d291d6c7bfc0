#include "kernels/core/thread_scratch.h"

#include <cstdint>
#include <thread>

#include "gtest/gtest.h"

namespace mlaserve {
namespace {

struct Buffer;
struct OtherBuffer;

int* KeptAddress(size_t size) {
  ThreadScratch<Buffer, int> scratch(size);
  return scratch.data();
}

TEST(ThreadScratchTest, ACallSiteGetsTheSameMemoryBackOnTheSameThread) {
  int* first = KeptAddress(1000);
  EXPECT_EQ(KeptAddress(1000), first);
  EXPECT_EQ(KeptAddress(10), first);  // smaller requests reuse the kept buffer
  ThreadScratch<Buffer, int> scratch(1000);
  scratch.data()[999] = 7;  // the whole size is usable
  EXPECT_EQ(scratch.span().size(), 1000u);
}

TEST(ThreadScratchTest, NestedUsesOfOneTagAndOtherTagsGetMemoryOfTheirOwn) {
  ThreadScratch<Buffer, int> outer(100);
  ThreadScratch<Buffer, int> nested(100);
  ThreadScratch<OtherBuffer, int> other(100);
  EXPECT_NE(outer.data(), nested.data());
  EXPECT_NE(outer.data(), other.data());
  for (int i = 0; i < 100; ++i) outer.data()[i] = i;
  for (int i = 0; i < 100; ++i) nested.data()[i] = -1;
  for (int i = 0; i < 100; ++i) ASSERT_EQ(outer.data()[i], i);
}

TEST(ThreadScratchTest, TheKeptBufferIsFreeAgainOnceItsUserEnds) {
  int* kept = nullptr;
  {
    ThreadScratch<Buffer, int> first(64);
    kept = first.data();
  }
  ThreadScratch<Buffer, int> second(64);
  EXPECT_EQ(second.data(), kept);
}

TEST(ThreadScratchTest, RequestsOverTheCapAreNotKept) {
  const size_t over = ThreadScratch<Buffer, int>::kMaxKeptBytes / sizeof(int) + 1;
  int* kept = KeptAddress(16);
  ThreadScratch<Buffer, int> large(over);
  large.data()[over - 1] = 1;
  EXPECT_NE(large.data(), kept);
  EXPECT_EQ(KeptAddress(16), kept);  // the large request did not replace the kept buffer
}

TEST(ThreadScratchTest, EachThreadHasItsOwnBuffer) {
  int* here = KeptAddress(256);
  int* there = nullptr;
  std::thread([&there] { there = KeptAddress(256); }).join();
  EXPECT_NE(here, there);
}

}  // namespace
}  // namespace mlaserve
