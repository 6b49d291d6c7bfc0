// Payload, the inline-stored callable every instruction carries: it behaves as std::function
// whether its target fits inline or not.
#include <cstring>
#include <functional>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/npu/program.h"

namespace mlaserve::npu {
namespace {

// A callable that counts its live copies and its calls (through pointers, so copies
// share the counters), padded to a chosen size to land inside a Payload or on the heap.
template <size_t kBytes>
struct Counted {
  int* live;
  int* calls;
  std::array<char, kBytes> padding{};
  Counted(int* l, int* c) : live(l), calls(c) { ++*live; }
  Counted(const Counted& o) : live(o.live), calls(o.calls), padding(o.padding) { ++*live; }
  Counted(Counted&& o) noexcept : live(o.live), calls(o.calls), padding(o.padding) { ++*live; }
  ~Counted() { --*live; }
  void operator()() { ++*calls; }
};

template <size_t kBytes>
void ExpectPayloadBehavesLikeAFunction() {
  int live = 0, calls = 0;
  {
    Payload a = Counted<kBytes>(&live, &calls);
    EXPECT_TRUE(a);
    EXPECT_EQ(live, 1);
    a();
    Payload b = a;  // a copy has its own target
    EXPECT_EQ(live, 2);
    b();
    Payload c = std::move(a);  // a move takes it over
    EXPECT_FALSE(a);
    EXPECT_EQ(live, 2);
    c();
    std::vector<Payload> grown;
    for (int i = 0; i < 40; ++i) grown.push_back(c);  // relocated as the vector grows
    EXPECT_EQ(live, 42);
    for (const Payload& p : grown) p();
    grown.clear();
    EXPECT_EQ(live, 2);
    b = nullptr;
    EXPECT_TRUE(b == nullptr);
    EXPECT_EQ(live, 1);
    c = [&calls] { calls += 100; };  // replacing the target destroys the old one
    EXPECT_EQ(live, 0);
    c();
  }
  EXPECT_EQ(live, 0);
  EXPECT_EQ(calls, 3 + 40 + 100);
}

TEST(PayloadTest, InlineTargetsBehaveLikeStdFunction) {
  static_assert(sizeof(Counted<16>) <= Payload::kInlineBytes);
  ExpectPayloadBehavesLikeAFunction<16>();
}

TEST(PayloadTest, TargetsTooLargeToStoreInlineBehaveLikeStdFunction) {
  static_assert(sizeof(Counted<200>) > Payload::kInlineBytes);
  ExpectPayloadBehavesLikeAFunction<200>();
}

TEST(PayloadTest, EmptyPayloadsAreFalseAndNull) {
  Payload empty;
  EXPECT_FALSE(empty);
  EXPECT_TRUE(empty == nullptr);
  Payload null = nullptr;
  EXPECT_FALSE(null);
  int state = 0;
  const Payload counter = [state, &out = state]() mutable { out = ++state; };  // mutable target
  counter();
  counter();
  EXPECT_EQ(state, 2);
}

}  // namespace
}  // namespace mlaserve::npu
