// The batch-invariant mode (DecodeBatch::batch_invariant) as the builder writes it and as the
// host runner computes it: fixed-length split parts, projection jobs cut to a few rows, no
// naive passes, and every answer bit for bit what its query gets alone.

#include <random>
#include <variant>
#include <vector>

#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/core/row_matmul.h"
#include "kernels/mla/batch_step_builder.h"
#include "kernels/mla/host_batch_runner.h"
#include "tests/testing/batch_invariance_check.h"
#include "tests/testing/decode_batch_scenario.h"

namespace mlaserve {
namespace {

using mlaserve::testing::BatchScenario;
using mlaserve::testing::BatchScenarioSpec;
using ::testing::Each;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::Le;

// The split-merge job of the row group whose destination is the first of `batch`'s answers.
size_t PartsOfFirstAnswer(const BuiltBatch& built) {
  for (const BatchStep& step : built.steps.steps) {
    const auto* merge = std::get_if<CombineStep>(&step);
    if (merge == nullptr || merge->name != "split_merge") continue;
    for (const CombineJob& job : merge->jobs) {
      if (job.lse.buffer == built.answers[0][0].lse.buffer &&
          job.lse.offset == built.answers[0][0].lse.offset)
        return job.parts.size();
    }
  }
  return 1;  // not split
}

// A 9,000-key latent query alone and beside 40 others, on 24 units: balanced parts depend on
// the batch (alone it is cut to fill the units, beside 40 others not at all); the mode's are
// ceil(9000 / 4096) = 3 either way.
TEST(BatchInvariantStepsTest, ARowGroupsPartsDependOnItsKeysAlone) {
  BatchScenarioSpec alone;
  alone.parallel_units = 24;
  alone.split_block_tokens = 64;
  alone.groups = {{.head_space = false, .sq = 1, .own_tokens = {9000}}};
  BatchScenarioSpec crowded = alone;
  for (int i = 0; i < 40; ++i) crowded.groups[0].own_tokens.push_back(100 + 37 * i);
  for (const bool invariant : {false, true}) {
    SCOPED_TRACE(invariant ? "invariant" : "balanced");
    alone.batch_invariant = crowded.batch_invariant = invariant;
    auto lone = BatchScenario::Make(alone, 1);
    auto many = BatchScenario::Make(crowded, 1);
    auto lone_built = BuildBatchSteps(lone->batch());
    auto many_built = BuildBatchSteps(many->batch());
    ASSERT_TRUE(lone_built.ok() && many_built.ok());
    if (invariant) {
      EXPECT_EQ(PartsOfFirstAnswer(*lone_built), 3u);
      EXPECT_EQ(PartsOfFirstAnswer(*many_built), 3u);
    } else {
      EXPECT_GT(PartsOfFirstAnswer(*lone_built), 3u);
      EXPECT_EQ(PartsOfFirstAnswer(*many_built), 1u);
    }
  }
}

// A part holds about the same work whatever the query's shape: a row group of 256 rows (an
// MTP query of 128 heads) takes parts of 8,192 keys, one of 128 rows parts of 4,096.
TEST(BatchInvariantStepsTest, RowGroupsOfMoreRowsTakeLongerParts) {
  BatchScenarioSpec spec;
  spec.heads = 128;
  spec.split_block_tokens = 64;
  spec.batch_invariant = true;
  for (const int sq : {1, 2}) {
    spec.groups = {{.head_space = false, .sq = sq, .own_tokens = {9000}}};
    auto s = BatchScenario::Make(spec, 5);
    auto built = BuildBatchSteps(s->batch());
    ASSERT_TRUE(built.ok()) << built.status();
    EXPECT_EQ(PartsOfFirstAnswer(*built), sq == 1 ? 3u : 2u) << "sq " << sq;
  }
}

// In the mode each projection job takes at most invariant_projection_rows rows (the rest of
// its rows in further jobs), or one where B is [n][k] (weights as loaded: project_out's
// W_UV, which the row kernel does not take), and the step says it is invariant; out of it
// one job a head.
TEST(BatchInvariantStepsTest, ProjectionJobsAreCutToTheDevicesRows) {
  BatchScenarioSpec spec;
  spec.heads = 4;
  spec.groups = {{.head_space = true, .sq = 2, .own_tokens = {10, 20, 30, 40, 50}}};
  spec.invariant_projection_rows = 4;
  for (const bool tiles : {true, false}) {
    spec.weight_tiles = tiles;
    for (const bool invariant : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (tiles ? "tiles" : "as loaded") << ", "
                                        << (invariant ? "invariant" : "default"));
      spec.batch_invariant = invariant;
      auto s = BatchScenario::Make(spec, 2);
      auto built = BuildBatchSteps(s->batch());
      ASSERT_TRUE(built.ok()) << built.status();
      for (const BatchStep& step : built->steps.steps) {
        const auto* p = std::get_if<ProjectionStep>(&step);
        if (p == nullptr) continue;
        SCOPED_TRACE(p->name);
        EXPECT_EQ(p->batch_invariant, invariant);
        // 5 queries x 2 tokens = 10 rows a head: 4 + 4 + 2 in the mode, or 10 of one row.
        const bool one_row = invariant && !tiles && p->name == "project_out";
        const int most = !invariant ? 10 : one_row ? 1 : 4;
        EXPECT_EQ(p->jobs.size(), 4u * (!invariant ? 1 : one_row ? 10 : 3));
        EXPECT_THAT(p->jobs, Each(Field(&ProjectionJob::rows, Le(most))));
      }
    }
  }
}

// Whether a prefix runs in naive form depends on how many queries share it, so the mode takes
// no naive pass.
TEST(BatchInvariantStepsTest, NaivePassesAreRefused) {
  BatchScenarioSpec spec;
  spec.prefixes = {{-1, 300}};
  spec.groups = {{.head_space = true, .sq = 1, .prefix = 0, .own_tokens = {3, 9}, .hybrid = true}};
  spec.batch_invariant = true;
  auto s = BatchScenario::Make(spec, 3);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(built.status().message(), HasSubstr("naive passes"));
}

// The host device as the engine makes it: its threads as units, 64-key split blocks, the
// row kernel's rows as the projection cut.
mlaserve::testing::BatchRunner HostRunner(HostBatchRunner& runner) {
  return
      [&runner](const DecodeBatch& batch) -> absl::StatusOr<mlaserve::testing::BatchAnswerBytes> {
        DecodeBatch b = batch;
        b.parallel_units = runner.threads();
        b.split_block_tokens = HostBatchRunner::kSplitBlockTokens;
        b.split_part_overhead_blocks = HostBatchRunner::kSplitPartOverheadBlocks;
        b.invariant_projection_rows = kRowMatmulRows;
        ASSIGN_OR_RETURN(BuiltBatch built, BuildBatchSteps(b));
        ASSIGN_OR_RETURN(std::unique_ptr<BatchBuffers> buffers, runner.Run(built.steps));
        return mlaserve::testing::ReadAnswerBytes(built, *buffers);
      };
}

// A fresh seed each run; the check's trace names it.
uint64_t FreshSeed() { return std::random_device{}(); }

// Both weight layouts: the tiles the engine's CPU devices read, and kv_b_proj as loaded.
class HostBatchInvarianceTest : public ::testing::TestWithParam<bool> {};

TEST_P(HostBatchInvarianceTest, AQueryAnswersInAnyBatchAsItDoesAlone) {
  HostBatchRunner runner(2);
  mlaserve::testing::ExpectBatchInvariant(
      HostRunner(runner), mlaserve::testing::InvarianceScenario(8, GetParam()), FreshSeed());
}

INSTANTIATE_TEST_SUITE_P(WeightLayouts, HostBatchInvarianceTest, ::testing::Bool(),
                         [](const auto& param_info) {
                           return param_info.param ? "Tiles" : "AsLoaded";
                         });

}  // namespace
}  // namespace mlaserve
