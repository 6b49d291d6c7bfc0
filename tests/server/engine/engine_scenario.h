#ifndef MLASERVE_TESTS_SERVER_ENGINE_ENGINE_SCENARIO_H_
#define MLASERVE_TESTS_SERVER_ENGINE_ENGINE_SCENARIO_H_

#include <algorithm>
#include <cmath>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/random_fill.h"
#include "kernels/reference/golden_attention.h"
#include "server/engine/devices/host_attention_device.h"
#include "server/engine/engine_impl.h"
#include "server/engine/owned_decode_query.h"
#include "tests/testing/attention_checks.h"

namespace mlaserve::engine::testing {

// A small MLA model with the real head dims (so every kernel path is the production one) and
// few heads and layers (so tests are quick).
inline ModelConfig SmallModel(int heads = 8, int layers = 2) {
  ModelConfig m;
  m.name = "test-mla";
  m.heads = heads;
  m.layers = layers;
  m.softmax_scale = static_cast<float>(1.0 / std::sqrt(192.0));
  return m;
}

// The rates that put B_theta(sq) exactly at `b_theta_at_sq1 / sq` for a DeepSeek-shaped model:
// B_theta = (Dqk + Dv) / (Sq (2 Dl + Dr)) * T / M with T / M = b * 1088 / 320.
inline void SetThreshold(EngineOptions& options, double b_theta_at_sq1) {
  options.hbm_tbps = 1.0;
  options.matrix_tflops = b_theta_at_sq1 * (2.0 * 512 + 64) / (128 + 64 + 128);
}

// An answer copied out of the engine's buffers (which go when the callback returns), its
// output widened to fp32.
struct OwnedAnswer {
  ElementType out_type = ElementType::kFp32;
  std::vector<float> out;
  std::vector<float> lse;
  PlanInfo plan;
};

inline OwnedAnswer Own(const DecodeAnswer& a) {
  OwnedAnswer owned{
      a.out_type, std::vector<float>(a.out_elements), {a.lse.begin(), a.lse.end()}, a.plan};
  if (a.out_type == ElementType::kBf16) {
    for (int64_t i = 0; i < a.out_elements; ++i) owned.out[i] = a.out_bf16()[i].ToFloat();
  } else {
    std::copy(a.out_fp32().begin(), a.out_fp32().end(), owned.out.begin());
  }
  return owned;
}

inline absl::StatusOr<std::vector<OwnedAnswer>> DecodeSync(
    Engine& engine, const std::vector<OwnedDecodeQuery>& queries, DecodeOptions options = {}) {
  std::promise<absl::StatusOr<std::vector<OwnedAnswer>>> promise;
  auto future = promise.get_future();
  engine.Decode(Views(queries, engine.Info().model), std::move(options),
                [&promise](absl::StatusOr<std::span<const DecodeAnswer>> r) {
                  if (!r.ok()) {
                    promise.set_value(r.status());
                    return;
                  }
                  std::vector<OwnedAnswer> owned;
                  for (const DecodeAnswer& a : *r) owned.push_back(Own(a));
                  promise.set_value(std::move(owned));
                });
  return future.get();
}

// fp64 golden answer to `q` over a sequence whose latent rows (for q's layer) are `rows`.
// `softmax_scale`: the call's (DecodeOptions::softmax_scale); nullopt is the model's.
inline GoldenOutput GoldenAnswer(const ModelWeights& weights, const std::vector<Bf16>& rows,
                                 const OwnedDecodeQuery& q,
                                 std::optional<float> softmax_scale = std::nullopt) {
  const ModelConfig& m = weights.config();
  const float scale = softmax_scale.value_or(m.softmax_scale);
  const int n = static_cast<int>(rows.size() / m.dk_latent());
  const std::vector<int32_t> table = {0};
  const std::vector<int32_t> seqlens = {n};
  EXPECT_GT(n, 0) << "scenarios give every sequence at least one token";
  const PagedKvCache cache{*TensorView<const Bf16, 3>::Create(std::span<const Bf16>(rows),
                                                              {1, n, m.dk_latent()}, "rows")};
  const PagedSequences seqs{
      *TensorView<const int32_t, 2>::Create(std::span<const int32_t>(table), {1, 1}), seqlens};
  if (q.space == QuerySpace::kLatent) {
    const int heads = q.heads > 0 ? q.heads : m.heads;
    auto qv = *TensorView<const Bf16, 4>::Create(std::span<const Bf16>(q.q_latent),
                                                 {1, q.sq, heads, m.dk_latent()});
    return *GoldenLatentDecode({qv, cache, seqs, m.dl, scale, true});
  }
  if (q.heads > 0 && q.heads != m.heads) {
    // A range of the model's heads: the golden of the whole model's heads with q in the
    // range and zeros elsewhere, cut to the range (heads never mix).
    OwnedDecodeQuery whole = q;
    whole.heads = 0;
    whole.first_head = 0;
    whole.q_nope.assign(static_cast<size_t>(q.sq) * m.heads * m.dn, Bf16::FromFloat(0));
    whole.q_pe.assign(static_cast<size_t>(q.sq) * m.heads * m.dr, Bf16::FromFloat(0));
    for (int t = 0; t < q.sq; ++t) {
      for (int h = 0; h < q.heads; ++h) {
        const size_t from = static_cast<size_t>(t) * q.heads + h;
        const size_t to = static_cast<size_t>(t) * m.heads + q.first_head + h;
        std::copy_n(q.q_nope.begin() + from * m.dn, m.dn, whole.q_nope.begin() + to * m.dn);
        std::copy_n(q.q_pe.begin() + from * m.dr, m.dr, whole.q_pe.begin() + to * m.dr);
      }
    }
    const GoldenOutput all = GoldenAnswer(weights, rows, whole, softmax_scale);
    GoldenOutput cut;
    for (int t = 0; t < q.sq; ++t) {
      for (int h = 0; h < q.heads; ++h) {
        const size_t row = static_cast<size_t>(t) * m.heads + q.first_head + h;
        cut.out.insert(cut.out.end(), all.out.begin() + row * m.dv,
                       all.out.begin() + (row + 1) * m.dv);
        cut.lse.push_back(all.lse[row]);
      }
    }
    return cut;
  }
  const HeadSpaceDecodeProblem p{
      *TensorView<const Bf16, 4>::Create(std::span<const Bf16>(q.q_nope), {1, q.sq, m.heads, m.dn}),
      *TensorView<const Bf16, 4>::Create(std::span<const Bf16>(q.q_pe), {1, q.sq, m.heads, m.dr}),
      weights.Layer(q.layer),
      cache,
      seqs,
      scale,
      true};
  return *GoldenHeadSpaceDecode(p);
}

// Head-space answers carry the extra bf16 casts of the absorb form (q_lat, o_lat) or of the
// expanded K/V (naive form); the bounds are those of tests/kernels/mla/absorb_naive_test.cc.
inline constexpr mlaserve::testing::Tolerance kOutTolerance{
    mlaserve::testing::FlashMlaOutTolerance(1.0).abs_tol, 2.01 / 128, 2e-5};
inline constexpr mlaserve::testing::Tolerance kLseTolerance{1e-2, 8.01 / 65536, 0.0};

// Drives an engine with random data and remembers every latent row it gave it, so each
// answer can be checked against the fp64 golden computed from the same inputs.
class Scenario {
 public:
  // Every row and query is drawn N(0, data_scale^2) (0.1: FlashMLA's and SnapMLA's test
  // recipe, where the FP8 cache's accuracy bounds are set).
  explicit Scenario(std::unique_ptr<EngineImpl> engine, uint64_t seed = 1, double data_scale = 1.0)
      : engine_(std::move(engine)),
        model_(engine_->Info().model),
        rng_(seed),
        data_scale_(data_scale) {}

  EngineImpl& engine() { return *engine_; }
  const ModelConfig& model() const { return model_; }

  std::vector<Bf16> RandomRows(int64_t n) {
    std::vector<Bf16> rows(static_cast<size_t>(n) * model_.dk_latent());
    FillNormal(rows, data_scale_, rng_);
    return rows;
  }

  void RegisterPrefix(const std::string& id, const std::string& parent, int tokens,
                      std::optional<KvDtype> kv_dtype = std::nullopt) {
    std::vector<Bf16> latent;
    for (int l = 0; l < model_.layers; ++l) {
      std::vector<Bf16> rows = RandomRows(tokens);
      auto& mine = prefix_rows_[id][l];
      if (!parent.empty()) mine = prefix_rows_[parent][l];
      mine.insert(mine.end(), rows.begin(), rows.end());
      latent.insert(latent.end(), rows.begin(), rows.end());
    }
    auto view = TensorView<const Bf16, 3>::Create(std::span<const Bf16>(latent),
                                                  {model_.layers, tokens, model_.dk_latent()});
    ASSERT_TRUE(view.ok());
    ASSERT_TRUE(engine_->RegisterPrefix(id, parent, *view, kv_dtype).ok());
  }

  // A sequence on `prefix` (or none) with `own` tokens of its own in every layer.
  void CreateSequence(const std::string& id, const std::string& prefix, int own,
                      std::optional<KvDtype> kv_dtype = std::nullopt) {
    ASSERT_TRUE(engine_->CreateSequence(id, prefix, kv_dtype).ok());
    for (int l = 0; l < model_.layers; ++l) {
      rows_[id][l] = prefix.empty() ? std::vector<Bf16>{} : prefix_rows_[prefix][l];
      if (own > 0) Append(id, l, own);
    }
  }

  void Append(const std::string& id, int layer, int n) {
    std::vector<Bf16> rows = RandomRows(n);
    auto& all = rows_[id][layer];
    const int64_t position = static_cast<int64_t>(all.size()) / model_.dk_latent();
    auto view =
        TensorView<const Bf16, 2>::Create(std::span<const Bf16>(rows), {n, model_.dk_latent()});
    ASSERT_TRUE(engine_->AppendKv(id, layer, position, *view).ok());
    all.insert(all.end(), rows.begin(), rows.end());
  }

  int64_t Length(const std::string& id, int layer) {
    return static_cast<int64_t>(rows_[id][layer].size()) / model_.dk_latent();
  }

  // `heads` of the model's from `first_head` (0: all of them).
  OwnedDecodeQuery HeadQuery(const std::string& id, int layer, int sq, int heads = 0,
                             int first_head = 0) {
    OwnedDecodeQuery q;
    q.sequence_id = id;
    q.layer = layer;
    q.sq = sq;
    q.space = QuerySpace::kHead;
    q.heads = heads;
    q.first_head = first_head;
    const int h = heads > 0 ? heads : model_.heads;
    q.q_nope.resize(static_cast<size_t>(sq) * h * model_.dn);
    q.q_pe.resize(static_cast<size_t>(sq) * h * model_.dr);
    FillNormal(q.q_nope, data_scale_, rng_);
    FillNormal(q.q_pe, data_scale_, rng_);
    return q;
  }

  // `heads` query heads (0: the model's).
  OwnedDecodeQuery LatentQuery(const std::string& id, int layer, int sq, int heads = 0) {
    OwnedDecodeQuery q;
    q.sequence_id = id;
    q.layer = layer;
    q.sq = sq;
    q.space = QuerySpace::kLatent;
    q.heads = heads;
    q.q_latent.resize(static_cast<size_t>(sq) * (heads > 0 ? heads : model_.heads) *
                      model_.dk_latent());
    FillNormal(q.q_latent, data_scale_, rng_);
    return q;
  }

  // Records an append carried by a query (DecodeQuery::append_rows) as the engine will do.
  void AttachAppend(OwnedDecodeQuery& q, int n) {
    q.append_rows = RandomRows(n);
    q.append_position = Length(q.sequence_id, q.layer);
    auto& all = rows_[q.sequence_id][q.layer];
    all.insert(all.end(), q.append_rows.begin(), q.append_rows.end());
  }

  // fp64 golden for one query, from the rows this scenario gave the engine.
  GoldenOutput Golden(const OwnedDecodeQuery& q,
                      std::optional<float> softmax_scale = std::nullopt) {
    return GoldenAnswer(engine_->weights(), rows_[q.sequence_id][q.layer], q, softmax_scale);
  }

 private:
  std::unique_ptr<EngineImpl> engine_;
  ModelConfig model_;
  Rng rng_;
  double data_scale_;
  std::map<std::string, std::map<int, std::vector<Bf16>>> prefix_rows_;  // full chain rows
  std::map<std::string, std::map<int, std::vector<Bf16>>> rows_;         // sequences
};

// Every answer against the fp64 golden of its query (kOutTolerance, kLseTolerance).
inline void ExpectMatchesGolden(Scenario& s, const std::vector<OwnedDecodeQuery>& queries,
                                const std::vector<OwnedAnswer>& answers) {
  ASSERT_EQ(queries.size(), answers.size());
  for (size_t i = 0; i < queries.size(); ++i) {
    const GoldenOutput golden = s.Golden(queries[i]);
    EXPECT_TRUE(mlaserve::testing::AllClose(answers[i].out, golden.out, kOutTolerance, true))
        << "query " << i << " (" << queries[i].sequence_id << ")";
    EXPECT_TRUE(mlaserve::testing::AllClose(answers[i].lse, golden.lse, kLseTolerance, false))
        << "query " << i << " (" << queries[i].sequence_id << ")";
  }
}

}  // namespace mlaserve::engine::testing

#endif  // MLASERVE_TESTS_SERVER_ENGINE_ENGINE_SCENARIO_H_
