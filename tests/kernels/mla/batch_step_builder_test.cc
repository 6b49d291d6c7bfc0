#include "kernels/mla/batch_step_builder.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/core/random_fill.h"
#include "kernels/mla/fp8_accuracy.h"
#include "kernels/mla/host_batch_runner.h"
#include "kernels/mla/lse_combine.h"
#include "tests/testing/attention_checks.h"
#include "tests/testing/decode_batch_scenario.h"
#include "tests/testing/fp8_batch_check.h"

namespace mlaserve {
namespace {

using mlaserve::testing::BatchScenario;
using mlaserve::testing::BatchScenarioSpec;
using ::testing::ElementsAre;

// Head-space answers carry the absorb form's bf16 casts (q_lat, o_lat) or the expanded K/V's;
// the bounds of tests/kernels/mla/absorb_naive_test.cc.
constexpr mlaserve::testing::Tolerance kOutTolerance{
    mlaserve::testing::FlashMlaOutTolerance(1.0).abs_tol, 2.01 / 128, 2e-5};
constexpr mlaserve::testing::Tolerance kLseTolerance{1e-2, 8.01 / 65536, 0.0};

std::vector<std::string> StepNames(const BatchSteps& steps) {
  std::vector<std::string> names;
  for (const BatchStep& step : steps.steps) {
    std::visit([&](const auto& s) { names.push_back(s.name); }, step);
  }
  return names;
}

const AttentionStep& Attention(const BatchSteps& steps, const std::string& name) {
  for (const BatchStep& step : steps.steps) {
    if (const auto* a = std::get_if<AttentionStep>(&step); a != nullptr && a->name == name)
      return *a;
  }
  ADD_FAILURE() << "no attention step " << name;
  static const AttentionStep none;
  return none;
}

// Expected part lengths worked out by hand from waves x (part + 1) (the header's rule).
TEST(SplitPartBlocksTest, FillsTheCoresInTheFewestWavesAndSplitsOnlyWhenCoresIdle) {
  const std::vector<int> four_of_32(4, 32);
  EXPECT_EQ(SplitPartBlocks(four_of_32, 24), 6);  // 6 parts each: 24 items, one wave of 6
  const std::vector<int> twenty_four_of_32(24, 32);
  EXPECT_EQ(SplitPartBlocks(twenty_four_of_32, 24), 32);      // a group per core: no split
  EXPECT_EQ(SplitPartBlocks(std::vector<int>{1}, 24), 1);     // one block cannot be cut
  EXPECT_EQ(SplitPartBlocks(std::vector<int>{3}, 24), 1);     // never more parts than blocks
  EXPECT_EQ(SplitPartBlocks(std::vector<int>{8, 2}, 4), 3);   // 3 + 1 parts, one wave of 3
  EXPECT_EQ(SplitPartBlocks(std::vector<int>{100}, 1), 100);  // one core
  // 32 groups of 36 blocks on 48 cores: halves would make 64 parts, two waves of 18 (worse
  // than no split); thirds make 96 parts, two full waves of 12.
  const std::vector<int> thirty_two_of_36(32, 36);
  EXPECT_EQ(SplitPartBlocks(thirty_two_of_36, 48), 12);
  EXPECT_EQ(SplitPartBlocks(std::vector<int>{}, 48), 1);  // nothing to split
}

// A GPU's thread blocks run in waves: 192 tiles on 132 SMs take two waves, the second not half
// full; halves make three full waves of half the length (3 x 129 < 2 x 257).
TEST(SplitPartBlocksTest, BalancingWavesSplitsGroupsThatAlreadyFillTheUnits) {
  EXPECT_EQ(SplitPartBlocks(std::vector<int>(192, 256), 132), 256);  // by default: no split
  EXPECT_EQ(SplitPartBlocks(std::vector<int>(192, 256), 132, true), 128);
  EXPECT_EQ(SplitPartBlocks(std::vector<int>(192, 16), 132, true), 8);  // 3 x 9 < 2 x 17
  // Two full waves already: nothing gained.
  EXPECT_EQ(SplitPartBlocks(std::vector<int>(264, 256), 132, true), 256);
}

TEST(BatchStepBuilderTest, AbsorbOnlyHeadSpaceIsProjectAttendProject) {
  BatchScenarioSpec spec;
  spec.groups = {{.head_space = true, .sq = 1, .prefix = -1, .own_tokens = {10, 20}}};
  auto s = BatchScenario::Make(spec, 1);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_THAT(StepNames(built->steps), ElementsAre("absorb_q", "latent", "project_out"));
  // One row group per member (8 heads x 1 token), each over its own keys.
  const AttentionStep& latent = Attention(built->steps, "latent");
  ASSERT_EQ(latent.groups.size(), 2u);
  EXPECT_THAT(latent.groups[1].visible, ::testing::Each(20));
}

TEST(BatchStepBuilderTest, LatentSpaceIsOneAttentionStep) {
  BatchScenarioSpec spec;
  spec.groups = {{.head_space = false, .sq = 2, .prefix = -1, .own_tokens = {10}}};
  auto s = BatchScenario::Make(spec, 2);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_THAT(StepNames(built->steps), ElementsAre("latent"));
  // Causal MTP: token 0 sees 9 keys, token 1 all 10; rows are (token, head).
  const AttentionStep& latent = Attention(built->steps, "latent");
  EXPECT_EQ(latent.groups[0].visible.front(), 9);
  EXPECT_EQ(latent.groups[0].visible.back(), 10);
}

TEST(BatchStepBuilderTest, HybridAddsNaivePassesAndAMergeAfterTheProjection) {
  BatchScenarioSpec spec;
  spec.prefixes = {{-1, 100}};
  spec.groups = {{.head_space = true, .sq = 1, .prefix = 0, .own_tokens = {5}, .hybrid = true}};
  auto s = BatchScenario::Make(spec, 3);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_THAT(StepNames(built->steps),
              ElementsAre("absorb_q", "latent", "naive", "project_out", "prefix_merge"));
  // The absorb part starts after the prefix: 5 keys of its own.
  EXPECT_THAT(Attention(built->steps, "latent").groups[0].visible, ::testing::Each(5));
  // One naive row group per head over the prefix's 100 keys.
  const AttentionStep& naive = Attention(built->steps, "naive");
  EXPECT_EQ(naive.groups.size(), 8u);
  EXPECT_THAT(naive.groups[0].visible, ::testing::Each(100));
}

TEST(BatchStepBuilderTest, TreeAwarePassesReadASharedLevelOnceForAllItsGroups) {
  BatchScenarioSpec spec;
  spec.prefixes = {{-1, 300}, {0, 100}, {0, 100}};
  spec.groups = {
      {.head_space = true, .sq = 1, .prefix = 1, .own_tokens = {1, 2, 3}, .hybrid = true},
      {.head_space = true, .sq = 1, .prefix = 2, .own_tokens = {4, 5}, .hybrid = true}};
  auto shared = BatchScenario::Make(spec, 4);
  spec.shared_passes = false;
  auto flat = BatchScenario::Make(spec, 4);
  ASSERT_EQ(shared->batch().passes.size(), 3u);  // the root once, each child once
  ASSERT_EQ(flat->batch().passes.size(), 4u);    // the root once per group
  auto built_shared = BuildBatchSteps(shared->batch());
  auto built_flat = BuildBatchSteps(flat->batch());
  ASSERT_TRUE(built_shared.ok() && built_flat.ok());
  // Shared: per head, one row group of 5 rows over the root plus one per child; flat: two
  // over the root.
  const AttentionStep& a = Attention(built_shared->steps, "naive");
  const AttentionStep& b = Attention(built_flat->steps, "naive");
  EXPECT_EQ(a.groups.size(), 3u * 8);
  EXPECT_EQ(b.groups.size(), 4u * 8);
  EXPECT_EQ(a.groups[0].rows, 5);
}

TEST(BatchStepBuilderTest, SparseStepsSplitTheirKeysAndMergeThemBack) {
  BatchScenarioSpec spec;
  spec.parallel_units = 24;
  spec.groups = {{.head_space = true, .sq = 1, .prefix = -1, .own_tokens = {4096, 2048}}};
  auto s = BatchScenario::Make(spec, 5);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_THAT(StepNames(built->steps),
              ElementsAre("absorb_q", "latent", "split_merge", "project_out"));
  // 8 + 4 blocks over 24 cores: one block per part.
  EXPECT_EQ(Attention(built->steps, "latent").groups.size(), 12u);
  const auto& merge = std::get<CombineStep>(built->steps.steps[2]);
  ASSERT_EQ(merge.jobs.size(), 2u);
  EXPECT_EQ(merge.jobs[0].parts.size(), 8u);
  EXPECT_EQ(merge.jobs[1].parts.size(), 4u);
}

// A unit that takes fewer rows than a row group holds (a GPU's 64-row thread block against a
// 128-head query's 128 rows) is kept busy by each group that many times over: the balance
// counts it so, and splits less.
TEST(BatchStepBuilderTest, UnitsOfFewerRowsCountARowGroupSeveralTimes) {
  BatchScenarioSpec spec;
  spec.heads = 128;
  spec.parallel_units = 12;
  spec.groups = {
      {.head_space = false, .sq = 1, .own_tokens = {5120, 5120, 5120, 5120, 5120, 5120}}};
  auto s = BatchScenario::Make(spec, 8);
  auto whole = BuildBatchSteps(s->batch());
  ASSERT_TRUE(whole.ok()) << whole.status();
  // 6 groups of 10 blocks of 512 keys on 12 units: two parts each (a wave of 5 + 1, not 10).
  EXPECT_EQ(Attention(whole->steps, "latent").groups.size(), 12u);
  DecodeBatch tiled = s->batch();
  tiled.unit_rows = 64;
  auto built = BuildBatchSteps(tiled);
  ASSERT_TRUE(built.ok()) << built.status();
  // Each group already keeps two units busy: 12 units in one wave of 11, no split.
  EXPECT_EQ(Attention(built->steps, "latent").groups.size(), 6u);
}

// A pass over expanded heads counts its units by dense_unit_rows (a Hopper thread block takes
// two 64-row tiles of the naive pass) where that is set: fewer units busy, so more parts.
TEST(BatchStepBuilderTest, DenseUnitRowsCountTheNaivePassApart) {
  BatchScenarioSpec spec;
  spec.heads = 8;
  spec.parallel_units = 16;
  spec.prefixes = {{.parent = -1, .tokens = 2048}};
  spec.groups = {{.head_space = true,
                  .sq = 1,
                  .prefix = 0,
                  .own_tokens = std::vector<int>(128, 3),
                  .hybrid = true}};
  auto s = BatchScenario::Make(spec, 9);
  DecodeBatch tiled = s->batch();
  tiled.unit_rows = 64;
  tiled.split_block_tokens = 64;
  auto by_tiles = BuildBatchSteps(tiled);
  ASSERT_TRUE(by_tiles.ok()) << by_tiles.status();
  // 8 heads of 128 rows: 16 units of 64 rows busy, no split.
  EXPECT_EQ(Attention(by_tiles->steps, "naive").groups.size(), 8u);
  tiled.dense_unit_rows = 128;
  auto by_pairs = BuildBatchSteps(tiled);
  ASSERT_TRUE(by_pairs.ok()) << by_pairs.status();
  // 8 units of 128 rows on 16: each head's keys in two parts.
  EXPECT_EQ(Attention(by_pairs->steps, "naive").groups.size(), 16u);
}

TEST(BatchStepBuilderTest, RejectsPassesThatDoNotTileThePrefix) {
  BatchScenarioSpec spec;
  spec.prefixes = {{-1, 100}, {0, 50}};
  spec.groups = {{.head_space = true, .sq = 1, .prefix = 1, .own_tokens = {5}, .hybrid = true}};
  auto s = BatchScenario::Make(spec, 6);
  DecodeBatch batch = s->batch();
  batch.groups[0].naive_passes = {1};  // skips the root level
  batch.passes[0].groups.clear();
  EXPECT_EQ(BuildBatchSteps(batch).status().code(), absl::StatusCode::kInvalidArgument);
  batch = s->batch();
  batch.groups[0].absorb_from = 120;  // not where the passes end
  EXPECT_EQ(BuildBatchSteps(batch).status().code(), absl::StatusCode::kInvalidArgument);
  batch = s->batch();
  batch.groups[0].members[0].pages = batch.groups[0].members[0].pages.first(1);  // too few pages
  EXPECT_EQ(BuildBatchSteps(batch).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BatchStepsTest, ValidationCatchesAReferencePastItsBuffer) {
  BatchScenarioSpec spec;
  spec.groups = {{.head_space = true, .sq = 1, .prefix = -1, .own_tokens = {10}}};
  auto s = BatchScenario::Make(spec, 7);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok());
  ASSERT_TRUE(ValidateBatchSteps(built->steps).ok());
  BatchSteps broken = built->steps;
  std::get<ProjectionStep>(broken.steps[0]).jobs.back().rows += 1;  // one row past q_nope
  EXPECT_EQ(ValidateBatchSteps(broken).code(), absl::StatusCode::kInternal);
  broken = built->steps;
  std::get<AttentionStep>(broken.steps[1]).groups[0].visible[0] = 65;  // a key past its one page
  EXPECT_EQ(ValidateBatchSteps(broken).code(), absl::StatusCode::kInternal);
  HostBatchRunner runner;
  EXPECT_EQ(runner.Run(broken).status().code(), absl::StatusCode::kInternal);
}

// The merge of n parts against the fp64 formula: exact up to fp32 rounding.
TEST(CombineLsePartsTest, MatchesTheFp64FormulaAndTheTwoPartMerge) {
  Rng rng(11);
  NormalSampler<double> normal;
  constexpr int kDv = 64;
  for (int parts : {1, 2, 3, 7, 32}) {
    std::vector<std::vector<float>> outs(parts, std::vector<float>(kDv));
    std::vector<float> lses(parts);
    std::vector<const float*> ptrs;
    for (int p = 0; p < parts; ++p) {
      for (float& x : outs[p]) x = static_cast<float>(normal(rng));
      lses[p] =
          p == 1 ? -std::numeric_limits<float>::infinity() : static_cast<float>(5 * normal(rng));
      ptrs.push_back(outs[p].data());
    }
    std::vector<float> out(kDv);
    float lse = 0;
    CombineLseParts(parts, ptrs.data(), lses.data(), kDv, out.data(), &lse);
    double m = -INFINITY;
    for (float l : lses) m = std::max<double>(m, l);
    double total = 0;
    for (float l : lses) total += std::exp(double{l} - m);
    EXPECT_NEAR(lse, m + std::log(total), 1e-5 * std::max(1.0, std::abs(m))) << parts;
    for (int d = 0; d < kDv; ++d) {
      double expected = 0;
      for (int p = 0; p < parts; ++p)
        expected += std::exp(double{lses[p]} - m) / total * outs[p][d];
      EXPECT_NEAR(out[d], expected, 1e-6 * parts * (1 + std::abs(expected)))
          << parts << " parts, element " << d;
    }
    if (parts == 2) {
      std::vector<float> pair(kDv);
      float pair_lse = 0;
      CombineLse(outs[0].data(), lses[0], outs[1].data(), lses[1], kDv, pair.data(), &pair_lse);
      EXPECT_EQ(pair, out);
      EXPECT_EQ(pair_lse, lse);
    }
  }
}

class StandardBatchTest : public ::testing::TestWithParam<mlaserve::testing::NamedScenario> {};

// Every answer of every standard batch, run by the host runner on two threads, against the
// fp64 golden of the same inputs.
TEST_P(StandardBatchTest, HostRunnerMatchesTheGolden) {
  auto s = BatchScenario::Make(GetParam().spec, 100);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok()) << built.status();
  HostBatchRunner runner(2);
  auto buffers = runner.Run(built->steps);
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  for (size_t g = 0; g < built->answers.size(); ++g) {
    for (size_t m = 0; m < built->answers[g].size(); ++m) {
      const auto answer = mlaserve::testing::ReadAnswer(**buffers, built->answers[g][m]);
      const GoldenOutput golden = s->Golden(static_cast<int>(g), static_cast<int>(m));
      EXPECT_TRUE(mlaserve::testing::AllClose(answer.out, golden.out, kOutTolerance, true))
          << "group " << g << " member " << m;
      EXPECT_TRUE(mlaserve::testing::AllClose(answer.lse, golden.lse, kLseTolerance, false))
          << "group " << g << " member " << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Batches, StandardBatchTest,
                         ::testing::ValuesIn(mlaserve::testing::StandardBatchScenarios()),
                         [](const auto& param_info) { return param_info.param.name; });
INSTANTIATE_TEST_SUITE_P(InvariantBatches, StandardBatchTest,
                         ::testing::ValuesIn(mlaserve::testing::InvariantBatchScenarios()),
                         [](const auto& param_info) { return param_info.param.name; });

class Fp8BatchTest : public ::testing::TestWithParam<mlaserve::testing::NamedScenario> {};

// The same batches on the FP8 cache (fp8 groups' absorb parts run SnapMLA over AMLA, their
// naive passes read K/V expanded from the dequantised rows), against the fp64 golden of the
// unquantised inputs: SnapMLA's bounds (tests/testing/fp8_batch_check.h), in both output spaces,
// hybrid and absorb-only, MTP, split-KV; bf16 groups in the mixed batch keep their own bounds.
TEST_P(Fp8BatchTest, HostRunnerMeetsSnapMlaBoundsAgainstTheGolden) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  auto s = BatchScenario::Make(GetParam().spec, seed);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok()) << built.status();
  HostBatchRunner runner(2);
  auto buffers = runner.Run(built->steps);
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  mlaserve::testing::Fp8BatchCheck fp8_check;
  for (size_t g = 0; g < built->answers.size(); ++g) {
    const bool fp8 = s->batch().groups[g].kv_dtype == KvDtype::kFp8;
    for (size_t m = 0; m < built->answers[g].size(); ++m) {
      const auto answer = mlaserve::testing::ReadAnswer(**buffers, built->answers[g][m]);
      const GoldenOutput golden = s->Golden(static_cast<int>(g), static_cast<int>(m));
      if (!fp8) {
        EXPECT_TRUE(mlaserve::testing::AllClose(answer.out, golden.out, kOutTolerance, true));
        continue;
      }
      {
        SCOPED_TRACE(::testing::Message() << "group " << g << " member " << m);
        fp8_check.AddMember(answer, golden);
      }
      for (size_t i = 0; i < golden.lse.size(); ++i) {
        if (std::isinf(golden.lse[i])) {
          EXPECT_EQ(answer.lse[i], -INFINITY) << i;
        }
      }
    }
  }
  fp8_check.ExpectBatchWithinBounds();
}

INSTANTIATE_TEST_SUITE_P(Batches, Fp8BatchTest,
                         ::testing::ValuesIn(mlaserve::testing::Fp8BatchScenarios()),
                         [](const auto& param_info) { return param_info.param.name; });

// Split-KV changes where each part's softmax starts, and so the bf16 rounding of P, but not
// the answer beyond that: the split and the unsplit batch agree to the kernels' tolerance.
TEST(SplitKvTest, SplitAnswersAgreeWithUnsplitOnes) {
  BatchScenarioSpec spec;
  spec.groups = {{.head_space = false, .sq = 1, .prefix = -1, .own_tokens = {3000, 1800}}};
  auto whole = BatchScenario::Make(spec, 12);
  spec.parallel_units = 24;
  auto split = BatchScenario::Make(spec, 12);
  auto a = BuildBatchSteps(whole->batch());
  auto b = BuildBatchSteps(split->batch());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_GT(Attention(b->steps, "latent").groups.size(),
            Attention(a->steps, "latent").groups.size());
  HostBatchRunner runner;
  auto ra = runner.Run(a->steps);
  auto rb = runner.Run(b->steps);
  ASSERT_TRUE(ra.ok() && rb.ok());
  for (int m = 0; m < 2; ++m) {
    const auto x = mlaserve::testing::ReadAnswer(**ra, a->answers[0][m]);
    const auto y = mlaserve::testing::ReadAnswer(**rb, b->answers[0][m]);
    EXPECT_TRUE(
        mlaserve::testing::AllCloseF(y.out, x.out, mlaserve::testing::FlashMlaOutTolerance(1.0)));
    for (size_t i = 0; i < x.lse.size(); ++i)
      EXPECT_NEAR(y.lse[i], x.lse[i], 1e-5 * std::abs(x.lse[i]) + 1e-5);
  }
}

}  // namespace
}  // namespace mlaserve
