// The soak's churn book against a fake server that applies each call the way the real one
// does (positions checked, forks copied, releases forgotten): after any run of calls, some of
// them failing and retried, the book's idea of every sequence equals what the server holds.

#include "client/loadgen/soak_churn.h"

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mlaserve::loadgen {
namespace {

// What the server holds per sequence: on the prefix or not, and its own rows per layer.
struct FakeSequence {
  bool on_prefix = false;
  std::vector<std::vector<int32_t>> rows;
  int decode_steps_seen = 0;  // calls on layer 0 carrying it
};

class FakeServer {
 public:
  FakeServer(int layers, int prefix_tokens) : layers_(layers), prefix_tokens_(prefix_tokens) {}

  // Applies `a` as the server would; a precondition the server checks fails the test.
  void Apply(const ChurnAction& a, const ChurnBook& book) {
    switch (a.step) {
      case ChurnStep::kCreate: {
        ASSERT_EQ(held_.count(a.id), 0u) << "id reused: " << a.id;
        FakeSequence s;
        s.on_prefix = a.on_prefix;
        s.rows.resize(layers_);
        held_[a.id] = s;
        ++created_;
        break;
      }
      case ChurnStep::kAppendPrompt: {
        ASSERT_EQ(held_.count(a.id), 1u);
        FakeSequence& s = held_[a.id];
        for (int l = 0; l < layers_; ++l) {
          ASSERT_EQ(a.position, Length(s, l)) << "append not at the layer's length";
          ASSERT_FALSE(a.prompt[l].empty());
          s.rows[l].insert(s.rows[l].end(), a.prompt[l].begin(), a.prompt[l].end());
        }
        break;
      }
      case ChurnStep::kFork:
        ASSERT_EQ(held_.count(a.source_id), 1u);
        ASSERT_EQ(held_.count(a.id), 0u);
        held_[a.id] = held_[a.source_id];
        held_[a.id].decode_steps_seen = 0;
        ++forked_;
        break;
      case ChurnStep::kDecode: {
        ASSERT_EQ(a.slots.size(), a.appends.size());
        ASSERT_EQ(static_cast<int>(a.slots.size()), book.slots()) << "a call carries every slot";
        std::set<std::string> seen;
        for (size_t q = 0; q < a.slots.size(); ++q) {
          const std::string& id = book.slot(a.slots[q]).id;
          ASSERT_EQ(held_.count(id), 1u) << "decode of a sequence the server does not hold";
          ASSERT_TRUE(seen.insert(id).second) << "one sequence twice in a call";
          FakeSequence& s = held_[id];
          ASSERT_GT(s.rows[a.layer].size(), 0u) << "decoded before its prompt";
          ASSERT_EQ(a.positions[q], Length(s, a.layer));
          s.rows[a.layer].push_back(a.appends[q]);
          if (a.layer == 0) ++s.decode_steps_seen;
        }
        break;
      }
      case ChurnStep::kRelease: {
        ASSERT_EQ(held_.count(a.id), 1u);
        lives_.push_back(held_[a.id].decode_steps_seen);
        held_.erase(a.id);
        break;
      }
    }
  }

  int64_t Length(const FakeSequence& s, int layer) const {
    return (s.on_prefix ? prefix_tokens_ : 0) + static_cast<int64_t>(s.rows[layer].size());
  }

  const std::map<std::string, FakeSequence>& held() const { return held_; }
  const std::vector<int>& lives() const { return lives_; }
  int created() const { return created_; }
  int forked() const { return forked_; }

 private:
  int layers_;
  int prefix_tokens_;
  std::map<std::string, FakeSequence> held_;
  std::vector<int> lives_;  // decode steps of each released sequence (forks count from the fork)
  int created_ = 0, forked_ = 0;
};

ChurnOptions Options(int layers, int prefix_tokens) {
  ChurnOptions o;
  o.sequences = 5;
  o.layers = layers;
  o.prefix_rows.resize(prefix_tokens > 0 ? layers : 0);
  for (int l = 0; l < static_cast<int>(o.prefix_rows.size()); ++l) {
    for (int t = 0; t < prefix_tokens; ++t) o.prefix_rows[l].push_back(1000 * l + t);
  }
  o.min_prompt = 1;
  o.max_prompt = 6;
  o.min_life = 2;
  o.max_life = 7;
  o.prefix_fraction = 0.5;
  o.fork_fraction = 0.4;
  o.row_pool = 97;
  return o;
}

// Every live slot's keys (prefix rows, then its own) against the fake server's.
void ExpectBookMatchesServer(const ChurnBook& book, const FakeServer& server,
                             const ChurnOptions& o) {
  std::set<std::string> live;
  for (int i = 0; i < book.slots(); ++i) {
    const SoakSequence& s = book.slot(i);
    if (s.id.empty()) continue;
    live.insert(s.id);
    ASSERT_EQ(server.held().count(s.id), 1u) << s.id;
    const FakeSequence& f = server.held().at(s.id);
    for (int l = 0; l < o.layers; ++l) {
      std::vector<int32_t> expected;
      if (f.on_prefix) expected = o.prefix_rows[l];
      expected.insert(expected.end(), f.rows[l].begin(), f.rows[l].end());
      EXPECT_EQ(book.KeyRows(i, l), expected) << s.id << " layer " << l;
      EXPECT_EQ(book.Length(i, l), static_cast<int64_t>(expected.size()));
    }
  }
  std::set<std::string> held;
  for (const auto& [id, unused] : server.held()) held.insert(id);
  EXPECT_EQ(live, held) << "the book and the server disagree on which sequences exist";
}

void RunChurn(int layers, int prefix_tokens, uint64_t seed) {
  const ChurnOptions o = Options(layers, prefix_tokens);
  ChurnBook book(o, "t", seed);
  FakeServer server(layers, prefix_tokens);
  std::mt19937_64 rng(seed + 1);
  std::map<ChurnStep, int> steps;
  for (int call = 0; call < 3000; ++call) {
    const ChurnAction& a = book.Next();
    // One call in ten fails before reaching the server: nothing happens, the same call
    // comes back.
    if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) {
      const ChurnAction before = a;
      const ChurnAction& again = book.Next();
      EXPECT_EQ(again.step, before.step);
      EXPECT_EQ(again.id, before.id);
      EXPECT_EQ(again.appends, before.appends);
      EXPECT_EQ(again.prompt, before.prompt);
      continue;
    }
    ++steps[a.step];
    server.Apply(a, book);
    if (::testing::Test::HasFatalFailure()) return;
    book.Done();
    ExpectBookMatchesServer(book, server, o);
    if (::testing::Test::HasFailure()) return;
  }
  // Every kind of call happened, and the counts agree with the server's.
  for (ChurnStep s : {ChurnStep::kCreate, ChurnStep::kAppendPrompt, ChurnStep::kFork,
                      ChurnStep::kDecode, ChurnStep::kRelease}) {
    EXPECT_GT(steps[s], 0) << ChurnStepName(s);
  }
  EXPECT_EQ(book.counts().created, server.created());
  EXPECT_EQ(book.counts().forked, server.forked());
  EXPECT_EQ(book.counts().released, static_cast<int64_t>(server.lives().size()));
  // A sequence lives its drawn number of steps: within [min_life, max_life].
  for (int life : server.lives()) {
    EXPECT_GE(life, o.min_life);
    EXPECT_LE(life, o.max_life);
  }
  // What is left to release at the end is exactly what the server holds.
  std::vector<std::string> live = book.LiveIds();
  std::set<std::string> left(live.begin(), live.end());
  for (const auto& [id, unused] : server.held()) EXPECT_EQ(left.count(id), 1u) << id;
}

TEST(SoakChurnTest, BookMatchesServerOnOneLayerWithPrefix) { RunChurn(1, 9, 1); }
TEST(SoakChurnTest, BookMatchesServerOnThreeLayersWithPrefix) { RunChurn(3, 4, 2); }
TEST(SoakChurnTest, BookMatchesServerWithoutPrefix) { RunChurn(2, 0, 3); }

TEST(SoakChurnTest, ForkCopiesRowsAndLaterAppendsStaySeparate) {
  ChurnOptions o = Options(1, 3);
  o.sequences = 2;
  o.fork_fraction = 1.0;  // every replacement forks when it can
  o.min_life = o.max_life = 3;
  ChurnBook book(o, "f", 7);
  FakeServer server(1, 3);
  bool forked = false;
  for (int call = 0; call < 200 && !forked; ++call) {
    const ChurnAction a = book.Next();
    server.Apply(a, book);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    book.Done();
    if (a.step != ChurnStep::kFork) continue;
    forked = true;
    const int source = book.slot(0).id == a.source_id ? 0 : 1;
    EXPECT_EQ(book.KeyRows(a.slot, 0), book.KeyRows(source, 0));
    EXPECT_EQ(book.slot(a.slot).on_prefix, book.slot(source).on_prefix);
    // One decode call: each appends its own row, and neither sees the other's.
    const ChurnAction d = book.Next();
    ASSERT_EQ(d.step, ChurnStep::kDecode);
    server.Apply(d, book);
    book.Done();
    const std::vector<int32_t> a_rows = book.KeyRows(a.slot, 0);
    const std::vector<int32_t> s_rows = book.KeyRows(source, 0);
    ASSERT_EQ(a_rows.size(), s_rows.size());
    EXPECT_EQ(a_rows.back(), d.appends[a.slot]);
    EXPECT_EQ(s_rows.back(), d.appends[source]);
    ExpectBookMatchesServer(book, server, o);
  }
  EXPECT_TRUE(forked);
}

TEST(SoakChurnTest, ForkChainsStayBounded) {
  ChurnOptions o = Options(1, 0);
  o.sequences = 3;
  o.fork_fraction = 1.0;
  o.max_own_rows = 30;
  ChurnBook book(o, "b", 11);
  for (int call = 0; call < 5000; ++call) {
    book.Next();
    book.Done();
    for (int i = 0; i < book.slots(); ++i) {
      if (book.slot(i).id.empty() || book.slot(i).rows.empty()) continue;
      // A fork is taken only when a full life still fits.
      ASSERT_LE(static_cast<int>(book.slot(i).rows[0].size()), o.max_own_rows);
    }
  }
  EXPECT_GT(book.counts().forked, 0);
}

}  // namespace
}  // namespace mlaserve::loadgen
