#include "tests/testing/gpu_batch_checks.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/mla/batch_step_builder.h"
#include "kernels/mla/fp8_accuracy.h"
#include "tests/testing/attention_checks.h"
#include "tests/testing/fp8_batch_check.h"

namespace mlaserve::testing {

absl::StatusOr<ResidentInputs> ResidentInputs::Upload(gpu::GpuRuntime& runtime,
                                                      const BatchSteps& steps) {
  ResidentInputs inputs(runtime);
  for (const StepBuffer& b : steps.buffers) {
    if (b.kind != StepBuffer::Kind::kInput || inputs.placed_.contains(b.input)) continue;
    const int64_t bytes = b.elements * ElementBytes(b.type);
    absl::StatusOr<gpu::DevicePtr> at = runtime.Allocate(std::max<int64_t>(bytes, 1), b.name);
    if (!at.ok()) return at.status();
    inputs.placed_[b.input] = *at;
    if (absl::Status s = runtime.CopyToDevice(*at, b.input, bytes); !s.ok()) return s;
  }
  return inputs;
}

ResidentInputs::~ResidentInputs() {
  for (const auto& [host, device] : placed_) runtime_->Free(device);
}

gpu::InputResolver ResidentInputs::resolver() const {
  return [this](const StepBuffer& b) -> absl::StatusOr<gpu::DevicePtr> {
    auto it = placed_.find(b.input);
    if (it == placed_.end()) return absl::NotFoundError("never uploaded");
    return it->second;
  };
}

std::vector<std::byte> AllOutputBytes(const BatchSteps& steps, const BatchBuffers& buffers) {
  std::vector<std::byte> all;
  for (size_t i = 0; i < steps.buffers.size(); ++i) {
    const std::span<const std::byte> b = buffers.Bytes(static_cast<int>(i));
    all.insert(all.end(), b.begin(), b.end());
  }
  return all;
}

BatchRunner GpuBatchRunner(gpu::GpuRuntime& runtime) {
  return [&runtime](const DecodeBatch& batch) -> absl::StatusOr<BatchAnswerBytes> {
    DecodeBatch b = batch;
    b.parallel_units = runtime.properties().sm_count;
    gpu::UseGpuSplit(b, runtime.properties());
    ASSIGN_OR_RETURN(BuiltBatch built, BuildBatchSteps(b));
    ASSIGN_OR_RETURN(ResidentInputs inputs, ResidentInputs::Upload(runtime, built.steps));
    gpu::GpuBatchExecutor executor(runtime);
    ASSIGN_OR_RETURN(gpu::GpuBatchExecutor::Result run,
                     executor.Run(built.steps, inputs.resolver()));
    return ReadAnswerBytes(built, *run.buffers);
  };
}

std::vector<NamedScenario> GpuScenarios() {
  std::vector<NamedScenario> all;
  for (std::vector<NamedScenario> set : {StandardBatchScenarios(), Fp8BatchScenarios()}) {
    for (NamedScenario& s : set) {
      // A GPU reads kv_b_proj as the checkpoint lays it out (GpuLoweringTest checks the
      // refusal of the CPU's tile layout).
      if (!s.spec.weight_tiles) all.push_back(std::move(s));
    }
  }
  BatchScenarioSpec latent;
  latent.heads = 128;
  latent.data_scale = 0.1;
  latent.groups = {{.head_space = false, .sq = 1, .own_tokens = {4096, 1537, 100, 64, 1, 0}},
                   {.head_space = false, .sq = 2, .own_tokens = {3000, 700}, .out_bf16 = true}};
  all.push_back({"Model128HeadsLatent", latent});
  latent.parallel_units = 132;
  all.push_back({"Model128HeadsLatentSplit", latent});
  // 16 heads (the model with 8-way tensor parallelism): tiles of 16 rows, the narrow shape
  // on Hopper; bf16 and FP8 groups of lengths that leave one, two, three and many blocks.
  BatchScenarioSpec few_heads;
  few_heads.heads = 16;
  few_heads.data_scale = 0.1;
  few_heads.groups = {
      {.head_space = false, .sq = 1, .own_tokens = {4096, 1537, 100, 64, 1, 0, 130, 129}},
      {.head_space = false,
       .sq = 1,
       .own_tokens = {3000, 700, 1, 64, 65, 128, 190},
       .out_bf16 = true,
       .kv_dtype = KvDtype::kFp8}};
  all.push_back({"Model16HeadsLatent", few_heads});
  few_heads.parallel_units = 132;
  all.push_back({"Model16HeadsLatentSplit", few_heads});
  BatchScenarioSpec hybrid;
  hybrid.heads = 128;
  hybrid.data_scale = 0.1;
  hybrid.prefixes = {{.parent = -1, .tokens = 1024}};
  hybrid.groups = {{.head_space = true,
                    .sq = 1,
                    .prefix = 0,
                    .own_tokens = {128, 130, 5, 0},
                    .hybrid = true,
                    .out_bf16 = true}};
  hybrid.parallel_units = 132;
  all.push_back({"Model128HeadsHybrid", hybrid});
  hybrid.groups[0].kv_dtype = KvDtype::kFp8;
  all.push_back({"Model128HeadsHybridFp8", hybrid});
  // A naive pass of more rows than a tile holds (66 and 2 x 33 a head), over a prefix that
  // ends mid-block, split over the SMs.
  BatchScenarioSpec many;
  many.heads = 4;
  many.data_scale = 0.1;
  many.prefixes = {{.parent = -1, .tokens = 600}};
  std::vector<int> own_a, own_b;
  for (int i = 0; i < 66; ++i) own_a.push_back((i * 37) % 40);
  for (int i = 0; i < 33; ++i) own_b.push_back(1 + (i * 53) % 70);
  many.groups = {{.head_space = true, .sq = 1, .prefix = 0, .own_tokens = own_a, .hybrid = true},
                 {.head_space = true,
                  .sq = 2,
                  .prefix = 0,
                  .own_tokens = own_b,
                  .hybrid = true,
                  .out_bf16 = true}};
  many.parallel_units = 132;
  all.push_back({"HybridManyQueries", many});
  for (NamedScenario& s : InvariantBatchScenarios()) {
    if (!s.spec.weight_tiles) all.push_back(std::move(s));
  }
  latent.batch_invariant = true;
  all.push_back({"Model128HeadsLatentSplitInvariant", latent});
  return all;
}

Tolerance HeadSpaceOutTolerance(std::span<const double> golden) {
  double squares = 0.0;
  for (double v : golden) squares += v * v;
  const double rms = golden.empty() ? 0.0 : std::sqrt(squares / static_cast<double>(golden.size()));
  Tolerance tol = kGpuOutTolerance;
  tol.abs_tol = 2.5 * std::max(tol.abs_tol, FlashMlaOutTolerance(rms).abs_tol);
  return tol;
}

void ExpectGpuBatchMatchesGolden(gpu::GpuRuntime& runtime, const NamedScenario& scenario,
                                 uint64_t seed, int runs) {
  SCOPED_TRACE(::testing::Message() << scenario.name << " seed " << seed);
  auto s = BatchScenario::Make(scenario.spec, seed);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok()) << built.status();
  absl::StatusOr<ResidentInputs> inputs = ResidentInputs::Upload(runtime, built->steps);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  gpu::GpuBatchExecutor executor(runtime);
  auto run = executor.Run(built->steps, inputs->resolver());
  ASSERT_TRUE(run.ok()) << run.status();
  for (int again = 1; again < runs; ++again) {
    SCOPED_TRACE(::testing::Message() << "run " << again + 1);
    auto repeat = executor.Run(built->steps, inputs->resolver());
    ASSERT_TRUE(repeat.ok()) << repeat.status();
    for (size_t g = 0; g < built->answers.size(); ++g) {
      for (size_t m = 0; m < built->answers[g].size(); ++m) {
        const AnswerValues first = ReadAnswer(*run->buffers, built->answers[g][m]);
        const AnswerValues now = ReadAnswer(*repeat->buffers, built->answers[g][m]);
        ASSERT_EQ(now.out, first.out) << "group " << g << " member " << m;
        ASSERT_EQ(now.lse, first.lse) << "group " << g << " member " << m;
      }
    }
  }
  Fp8BatchCheck fp8_check;
  for (size_t g = 0; g < built->answers.size(); ++g) {
    const bool fp8 = s->batch().groups[g].kv_dtype == KvDtype::kFp8;
    for (size_t m = 0; m < built->answers[g].size(); ++m) {
      SCOPED_TRACE(::testing::Message() << "group " << g << " member " << m);
      const AnswerValues answer = ReadAnswer(*run->buffers, built->answers[g][m]);
      const GoldenOutput golden = s->Golden(static_cast<int>(g), static_cast<int>(m));
      // inf/-inf/NaN positions equal, as FlashMLA's check asks.
      for (size_t i = 0; i < golden.lse.size(); ++i) {
        EXPECT_EQ(std::isinf(answer.lse[i]), std::isinf(golden.lse[i])) << "lse " << i;
        EXPECT_FALSE(std::isnan(answer.lse[i])) << "lse " << i;
      }
      if (!fp8) {
        const bool head_space = s->batch().groups[g].head_space;
        EXPECT_TRUE(AllClose(answer.out, golden.out,
                             head_space ? HeadSpaceOutTolerance(golden.out) : kGpuOutTolerance,
                             true));
        EXPECT_TRUE(AllClose(answer.lse, golden.lse, kGpuLseTolerance, false));
        continue;
      }
      fp8_check.AddMember(answer, golden);
    }
  }
  fp8_check.ExpectBatchWithinBounds();
}

}  // namespace mlaserve::testing
