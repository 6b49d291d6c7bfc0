// Clients hammering one engine at once: decodes that carry appends, plain appends, forks,
// sequence churn and prefix churn, on a pool of two emulated NPUs with a threshold low enough
// that hybrid and absorb groups mix in the same batches. Every client checks a sample of its
// answers against the fp64 golden of the rows it alone wrote, so a batch that mixed up
// sequences, lost an append or read a released page shows up as a wrong answer. CI runs it
// under ThreadSanitizer as well (`make test` -> the tsan stage).
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/core/random_fill.h"
#include "tests/server/engine/engine_scenario.h"

namespace mlaserve::engine {
namespace {

using ::mlaserve::engine::testing::DecodeSync;
using ::mlaserve::engine::testing::GoldenAnswer;
using ::mlaserve::engine::testing::kLseTolerance;
using ::mlaserve::engine::testing::kOutTolerance;
using ::mlaserve::engine::testing::SetThreshold;
using ::mlaserve::engine::testing::SmallModel;

constexpr int kClients = 4;
constexpr int kModelLayers = 2;
constexpr auto kDuration = std::chrono::seconds(6);
constexpr int kMaxOpsPerClient = 400;

// A prefix's rows per layer, as registered.
using LayerRows = std::map<int, std::vector<Bf16>>;

class EngineStress {
 public:
  EngineStress() {
    EngineOptions options;
    options.model = SmallModel(/*heads=*/8, kModelLayers);
    options.weights.seed = 19;
    options.kv.budget_bytes = int64_t{96} << 20;
    options.kv.page_size = 16;
    options.devices = 2;
    options.profile = "ascend910-die";
    options.max_sq = 2;
    options.max_batch = 16;
    options.max_wait = absl::Microseconds(300);
    SetThreshold(options, 3.0);  // groups of >= 3 (sq 1) or >= 2 (sq 2) on a prefix go hybrid
    auto engine = CreateEngine(std::move(options));
    EXPECT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    model_ = engine_->Info().model;
    // The same seed gives the engine's weights, for the golden answers.
    weights_ = std::make_unique<ModelWeights>(*ModelWeights::FromSeed(model_, 19));
  }

  Engine& engine() { return *engine_; }
  const ModelConfig& model() const { return model_; }
  const ModelWeights& weights() const { return *weights_; }

  LayerRows RegisterPrefix(const std::string& id, const std::string& parent,
                           const LayerRows& parent_rows, int tokens, Rng& rng) {
    LayerRows rows = parent_rows;
    std::vector<Bf16> latent;
    for (int l = 0; l < kModelLayers; ++l) {
      std::vector<Bf16> mine(static_cast<size_t>(tokens) * model_.dk_latent());
      FillNormal(mine, 1.0, rng);
      rows[l].insert(rows[l].end(), mine.begin(), mine.end());
      latent.insert(latent.end(), mine.begin(), mine.end());
    }
    auto view = TensorView<const Bf16, 3>::Create(std::span<const Bf16>(latent),
                                                  {kModelLayers, tokens, model_.dk_latent()});
    EXPECT_TRUE(view.ok());
    EXPECT_TRUE(engine_->RegisterPrefix(id, parent, *view).ok()) << id;
    return rows;
  }

 private:
  std::unique_ptr<Engine> engine_;
  ModelConfig model_;
  std::unique_ptr<ModelWeights> weights_;
};

struct ClientReport {
  int decodes = 0;
  int checked = 0;
  int hybrid = 0;
  int failures = 0;  // unexpected statuses or wrong answers
};

// One client: its own sequences (on the shared prefixes or none), whose rows only it writes.
class Client {
 public:
  Client(EngineStress& stress, int index, const std::map<std::string, LayerRows>& prefixes)
      : s_(stress), index_(index), prefixes_(prefixes), rng_(1000 + index) {}

  ClientReport Run(std::chrono::steady_clock::time_point stop) {
    for (int op = 0; op < kMaxOpsPerClient && std::chrono::steady_clock::now() < stop; ++op) {
      if (sequences_.size() < 3) {
        Create();
        continue;
      }
      const int dice = static_cast<int>(rng_() % 20);
      if (dice == 0) {
        Release();
      } else if (dice == 1) {
        Fork();
      } else if (dice == 2) {
        Append();
      } else {
        Decode();
      }
    }
    for (const auto& [id, rows] : sequences_) {
      if (!s_.engine().ReleaseSequence(id).ok()) ++report_.failures;
    }
    return report_;
  }

 private:
  std::string Pick() {
    auto it = sequences_.begin();
    std::advance(it, rng_() % sequences_.size());
    return it->first;
  }

  std::vector<Bf16> RandomRows(int n) {
    std::vector<Bf16> rows(static_cast<size_t>(n) * s_.model().dk_latent());
    FillNormal(rows, 1.0, rng_);
    return rows;
  }

  void Create() {
    const std::string id = absl::StrCat("c", index_, "-", next_++);
    static const char* kPrefixes[] = {"sys", "sys/a", ""};
    const std::string prefix = kPrefixes[rng_() % 3];
    if (!s_.engine().CreateSequence(id, prefix).ok()) {
      ++report_.failures;
      return;
    }
    LayerRows rows = prefix.empty() ? LayerRows{} : prefixes_.at(prefix);
    sequences_[id] = rows;
    for (int l = 0; l < kModelLayers; ++l) AppendRows(id, l, 1 + static_cast<int>(rng_() % 40));
  }

  void Release() {
    const std::string id = Pick();
    if (!s_.engine().ReleaseSequence(id).ok()) ++report_.failures;
    sequences_.erase(id);
  }

  void Fork() {
    const std::string source = Pick();
    const std::string id = absl::StrCat("c", index_, "-", next_++);
    if (!s_.engine().ForkSequence(source, id).ok()) {
      ++report_.failures;
      return;
    }
    sequences_[id] = sequences_[source];
  }

  void AppendRows(const std::string& id, int layer, int n) {
    std::vector<Bf16> rows = RandomRows(n);
    auto& all = sequences_[id][layer];
    const int64_t position = static_cast<int64_t>(all.size()) / s_.model().dk_latent();
    auto view =
        TensorView<const Bf16, 2>::Create(std::span<const Bf16>(rows), {n, s_.model().dk_latent()});
    if (!s_.engine().AppendKv(id, layer, position, *view).ok()) {
      ++report_.failures;
      return;
    }
    all.insert(all.end(), rows.begin(), rows.end());
  }

  void Append() { AppendRows(Pick(), static_cast<int>(rng_() % kModelLayers), 1); }

  void Decode() {
    const ModelConfig& m = s_.model();
    // One to four of this client's sequences in one call, each query carrying its new token;
    // like a serving framework's step, the call's queries share a layer and a query length.
    std::vector<OwnedDecodeQuery> queries;
    std::vector<std::vector<Bf16>> expected_rows;
    const int n = 1 + static_cast<int>(rng_() % 4);
    const int layer = static_cast<int>(rng_() % kModelLayers);
    const int sq = 1 + static_cast<int>(rng_() % 2);
    for (int i = 0; i < n; ++i) {
      OwnedDecodeQuery q;
      q.sequence_id = Pick();
      bool duplicate = false;
      for (const OwnedDecodeQuery& other : queries) duplicate |= other.sequence_id == q.sequence_id;
      if (duplicate) continue;
      q.layer = layer;
      q.sq = sq;
      q.space = rng_() % 4 == 0 ? QuerySpace::kLatent : QuerySpace::kHead;
      if (q.space == QuerySpace::kHead) {
        q.q_nope.resize(static_cast<size_t>(q.sq) * m.heads * m.dn);
        q.q_pe.resize(static_cast<size_t>(q.sq) * m.heads * m.dr);
        FillNormal(q.q_nope, 1.0, rng_);
        FillNormal(q.q_pe, 1.0, rng_);
      } else {
        q.q_latent.resize(static_cast<size_t>(q.sq) * m.heads * m.dk_latent());
        FillNormal(q.q_latent, 1.0, rng_);
      }
      auto& all = sequences_[q.sequence_id][q.layer];
      q.append_rows = RandomRows(1);
      q.append_position = static_cast<int64_t>(all.size()) / m.dk_latent();
      all.insert(all.end(), q.append_rows.begin(), q.append_rows.end());
      expected_rows.push_back(all);
      queries.push_back(std::move(q));
    }
    auto answers = DecodeSync(s_.engine(), queries);
    ++report_.decodes;
    if (!answers.ok()) {
      ADD_FAILURE() << "client " << index_ << ": " << answers.status();
      ++report_.failures;
      return;
    }
    for (size_t i = 0; i < queries.size(); ++i) {
      if ((*answers)[i].plan.formulation == Formulation::kHybrid) ++report_.hybrid;
      if (rng_() % 4 != 0) continue;  // golden spot checks: one answer in four
      const GoldenOutput golden = GoldenAnswer(s_.weights(), expected_rows[i], queries[i]);
      const bool ok =
          mlaserve::testing::AllClose((*answers)[i].out, golden.out, kOutTolerance, true) &&
          mlaserve::testing::AllClose((*answers)[i].lse, golden.lse, kLseTolerance, false);
      EXPECT_TRUE(ok) << "client " << index_ << " query " << queries[i].sequence_id;
      report_.failures += ok ? 0 : 1;
      ++report_.checked;
    }
  }

  EngineStress& s_;
  const int index_;
  const std::map<std::string, LayerRows>& prefixes_;
  Rng rng_;
  int next_ = 0;
  std::map<std::string, LayerRows> sequences_;
  ClientReport report_;
};

TEST(EngineStressTest, ConcurrentClientsGetGoldenAnswersWhileStateChurns) {
  EngineStress stress;
  Rng rng(7);
  std::map<std::string, LayerRows> prefixes;
  prefixes["sys"] = stress.RegisterPrefix("sys", "", {}, 37, rng);
  prefixes["sys/a"] = stress.RegisterPrefix("sys/a", "sys", prefixes["sys"], 21, rng);

  const auto stop = std::chrono::steady_clock::now() + kDuration;
  std::atomic<bool> clients_done{false};
  // Prefixes that come and go beside the clients' traffic: registration, release, eviction.
  std::thread churn([&] {
    Rng churn_rng(99);
    for (int k = 0; !clients_done.load(); ++k) {
      const std::string id = absl::StrCat("dyn", k % 3);
      stress.RegisterPrefix(id, k % 2 ? "sys" : "", k % 2 ? prefixes["sys"] : LayerRows{},
                            5 + k % 7, churn_rng);
      EXPECT_TRUE(stress.engine().ReleasePrefix(id).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::vector<std::future<ClientReport>> clients;
  std::vector<std::unique_ptr<Client>> owners;
  for (int c = 0; c < kClients; ++c)
    owners.push_back(std::make_unique<Client>(stress, c, prefixes));
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(
        std::async(std::launch::async, [&owners, c, stop] { return owners[c]->Run(stop); }));
  }
  ClientReport total;
  for (auto& f : clients) {
    const ClientReport r = f.get();
    total.decodes += r.decodes;
    total.checked += r.checked;
    total.hybrid += r.hybrid;
    total.failures += r.failures;
  }
  clients_done = true;
  churn.join();

  EXPECT_EQ(total.failures, 0);
  EXPECT_GT(total.checked, 10);
  EXPECT_GT(total.hybrid, 0) << "the threshold should have sent some groups hybrid";
  const EngineStats stats = stress.engine().Stats();
  EXPECT_EQ(stats.kv.sequences, 0);
  EXPECT_GT(stats.batches, 0);
  EXPECT_LT(stats.batches, stats.queries) << "calls from different clients should share batches";
  std::printf("decodes %d, answers checked %d, hybrid answers %d, batches %ld, queries %ld\n",
              total.decodes, total.checked, total.hybrid, static_cast<long>(stats.batches),
              static_cast<long>(stats.queries));
  EXPECT_TRUE(stress.engine().Drain(absl::Now() + absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace mlaserve::engine
