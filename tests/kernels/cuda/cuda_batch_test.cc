// The CUDA half held to the same golden as the fake GPU (tests/kernels/gpu/): every standard
// and FP8 batch, the served model's own shapes, and a fault that takes the device out. Each
// test skips with a message where no GPU is present; with MLASERVE_REQUIRE_GPU=1 a missing
// GPU fails it instead.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/mla/batch_step_builder.h"
#include "tests/testing/decode_batch_scenario.h"
#include "tests/testing/gpu_batch_checks.h"

namespace mlaserve::cuda {
namespace {

using mlaserve::testing::NamedScenario;

// A fresh seed each run; MLASERVE_TEST_SEED=<n> repeats a failure's (its trace names it).
uint64_t Seed() {
  const char* v = std::getenv("MLASERVE_TEST_SEED");
  return v != nullptr ? std::strtoull(v, nullptr, 10) : std::random_device{}();
}

bool GpuRequired() {
  const char* v = std::getenv("MLASERVE_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(CudaOptions{}); }
  void Open(CudaOptions options) {
    auto runtime = CudaRuntime::Create(0, options);
    if (!runtime.ok()) {
      if (GpuRequired()) FAIL() << "MLASERVE_REQUIRE_GPU=1 and no GPU: " << runtime.status();
      GTEST_SKIP() << "no CUDA GPU here (" << runtime.status() << ")";
    }
    runtime_ = *std::move(runtime);
  }
  bool Hopper() const {
    return runtime_->properties().compute_major == 9 && runtime_->properties().compute_minor == 0;
  }
  std::unique_ptr<CudaRuntime> runtime_;
};

class CudaBatchTest : public CudaTest, public ::testing::WithParamInterface<NamedScenario> {};

TEST_P(CudaBatchTest, EveryStandardBatchMatchesTheGolden) {
  mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, GetParam(), Seed());
  EXPECT_TRUE(runtime_->health().ok()) << runtime_->health();
}

INSTANTIATE_TEST_SUITE_P(Batches, CudaBatchTest,
                         ::testing::ValuesIn(mlaserve::testing::GpuScenarios()),
                         [](const auto& param_info) { return param_info.param.name; });

// The kernels the best choice passes over, held to the same golden: the warpgroup one for
// every bf16 latent launch (and mma.sync for the rest), mma.sync for all, and the 64-row
// kernels where the narrow shape would take few rows; the model's shapes and the standard
// batches with every kind of key.
struct KernelChoice {
  std::string name;
  CudaOptions options;
};

class CudaOtherKernelsTest
    : public CudaTest,
      public ::testing::WithParamInterface<std::tuple<KernelChoice, NamedScenario>> {
 protected:
  void SetUp() override { Open(std::get<0>(GetParam()).options); }
};

TEST_P(CudaOtherKernelsTest, MatchTheGolden) {
  mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, std::get<1>(GetParam()), Seed());
  const CudaOptions& options = std::get<0>(GetParam()).options;
  if (options.attention != AttentionKernels::kBest) {
    EXPECT_EQ(runtime_->launch_counts().seesaw, 0);
  }
  if (!options.narrow) {
    EXPECT_EQ(runtime_->launch_counts().narrow, 0);
  }
}

std::vector<NamedScenario> OtherKernelScenarios() {
  std::vector<NamedScenario> some;
  for (NamedScenario& s : mlaserve::testing::GpuScenarios()) {
    if (s.name == "Mixed" || s.name == "AbsorbHeadMtpBf16" || s.name == "MixedBf16AndFp8" ||
        s.name == "HybridManyQueries" || s.name == "Latent" || s.name == "HybridOneLevel" ||
        s.name == "SplitLatent" || s.name.rfind("Model128HeadsLatent", 0) == 0 ||
        s.name.rfind("Model16HeadsLatent", 0) == 0) {
      some.push_back(std::move(s));
    }
  }
  return some;
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, CudaOtherKernelsTest,
    ::testing::Combine(::testing::Values(KernelChoice{"Wgmma",
                                                      {.attention = AttentionKernels::kWgmma}},
                                         KernelChoice{"Mma", {.attention = AttentionKernels::kMma}},
                                         KernelChoice{"Wide", {.narrow = false}}),
                       ::testing::ValuesIn(OtherKernelScenarios())),
    [](const auto& param_info) {
      return std::get<0>(param_info.param).name + std::get<1>(param_info.param).name;
    });

// On Hopper the model's latent batches (64-token pages, keys from row 0, split-KV parts of
// whole blocks) run on the seesaw kernel, and batches whose keys start mid-block (the absorb
// pass after a 700-token prefix) on the warpgroup one: both routes are what the golden checked.
TEST_F(CudaTest, HopperRunsWholeBlocksOnTheSeesawKernel) {
  if (!Hopper()) GTEST_SKIP() << "not a Hopper GPU: " << runtime_->properties().name;
  for (const NamedScenario& s : mlaserve::testing::GpuScenarios()) {
    if (s.name == "Model128HeadsLatentSplit") {
      mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, s, 11);
    }
  }
  EXPECT_GT(runtime_->launch_counts().seesaw, 0);
  EXPECT_EQ(runtime_->launch_counts().wgmma, 0);
  for (const NamedScenario& s : mlaserve::testing::StandardBatchScenarios()) {
    if (s.name == "HybridOneLevel")
      mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, s, 12);
  }
  EXPECT_GT(runtime_->launch_counts().wgmma, 0);
}

// FP8 launches whose tiles hold at most 16 rows (16 heads, whole and split) run mma.sync's
// narrow shape, and only those (the bf16 ones beside them the seesaw kernel): the golden
// checked that route, and 128 heads still take the 64-row kernels.
TEST_F(CudaTest, FewRowsOfTheFp8CacheRunOnTheNarrowShape) {
  if (!Hopper()) GTEST_SKIP() << "not a Hopper GPU: " << runtime_->properties().name;
  for (const NamedScenario& s : mlaserve::testing::GpuScenarios()) {
    if (s.name.rfind("Model16HeadsLatent", 0) == 0) {
      mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, s, 14);
    }
  }
  const LaunchCounts few = runtime_->launch_counts();
  EXPECT_GT(few.narrow, 0);
  EXPECT_GT(few.seesaw, 0);
  EXPECT_EQ(few.wgmma + few.mma, 0);
  for (const NamedScenario& s : mlaserve::testing::GpuScenarios()) {
    if (s.name == "Model128HeadsLatent") {
      mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, s, 15);
    }
  }
  EXPECT_EQ(runtime_->launch_counts().narrow, few.narrow);
}

// On Hopper the naive pass (expanded heads) runs on the warpgroup kernel, tiles of one head
// over 64 rows and a prefix ending mid-block included; the golden checked that route.
TEST_F(CudaTest, HopperRunsTheNaivePassOnTheExpandedHeadsKernel) {
  if (!Hopper()) GTEST_SKIP() << "not a Hopper GPU: " << runtime_->properties().name;
  for (const NamedScenario& s : mlaserve::testing::GpuScenarios()) {
    if (s.name == "Model128HeadsHybrid" || s.name == "HybridManyQueries") {
      mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, s, 13);
    }
  }
  EXPECT_GT(runtime_->launch_counts().expanded, 0);
  EXPECT_EQ(runtime_->launch_counts().mma, 0);
}

// The batch-invariance check on the GPU, split over its SMs as the engine's GPU device
// splits, with the served model's 128 heads (on Hopper the seesaw kernel): a query's answer
// in batches of 2 to 256 is the one it gets alone, and out of the mode some answer changes.
TEST_F(CudaTest, ABatchInvariantQueryAnswersInAnyBatchAsItDoesAlone) {
  mlaserve::testing::ExpectBatchInvariant(mlaserve::testing::GpuBatchRunner(*runtime_),
                                          mlaserve::testing::InvarianceScenario(128, false),
                                          Seed());
}

NamedScenario Scenario(const std::string& name) {
  for (NamedScenario& s : mlaserve::testing::GpuScenarios()) {
    if (s.name == name) return s;
  }
  ADD_FAILURE() << "no scenario " << name;
  return {};
}

// A few sequences' projections (3 and 4 rows a head: absorb_q's B [k][n], project_out's
// [n][k], the hybrid's fp32 absorb part and bf16 answers) run on the row kernel, six rows on
// the tiled GEMM, and with the row kernel turned off all of them; each held to the golden.
TEST_F(CudaTest, FewRowsProjectOnTheRowKernelAndManyOnTheTiledGemm) {
  for (const char* name : {"AbsorbHead", "Model128HeadsHybrid"}) {
    mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, Scenario(name), Seed());
  }
  EXPECT_GT(runtime_->launch_counts().gemv, 0);
  EXPECT_EQ(runtime_->launch_counts().gemm, 0);
  mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, Scenario("AbsorbHeadMtpBf16"), Seed());
  EXPECT_GT(runtime_->launch_counts().gemm, 0);

  Open(CudaOptions{.row_kernel = false});
  for (const char* name : {"AbsorbHead", "Model128HeadsHybrid"}) {
    mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, Scenario(name), Seed());
  }
  EXPECT_EQ(runtime_->launch_counts().gemv, 0);
  EXPECT_GT(runtime_->launch_counts().gemm, 0);
}

// A batch run again replays its launches as one CUDA graph, captured at the second run, and
// answers bit for bit as the first (direct) run did; with graphs off nothing is captured.
TEST_F(CudaTest, ARepeatedBatchReplaysItsGraphWithTheSameAnswers) {
  for (const char* name : {"AbsorbHead", "Model128HeadsLatentSplit", "Model128HeadsHybridFp8"}) {
    const LaunchCounts before = runtime_->launch_counts();
    mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, Scenario(name), Seed(), 4);
    EXPECT_EQ(runtime_->launch_counts().graphs_captured - before.graphs_captured, 1) << name;
    EXPECT_EQ(runtime_->launch_counts().graph_replays - before.graph_replays, 3) << name;
  }
  EXPECT_TRUE(runtime_->graphs_off().ok()) << runtime_->graphs_off();

  Open(CudaOptions{.graphs = 0});
  mlaserve::testing::ExpectGpuBatchMatchesGolden(*runtime_, Scenario("AbsorbHead"), Seed(), 3);
  EXPECT_EQ(runtime_->launch_counts().graph_replays, 0);
}

// Queries in a memfd mapped shared, as a data plane's region is, mapped into the GPU: the copy
// launch reads them in place (nothing of them uploaded) and the answers are those of the
// uploaded run bit for bit. With MLASERVE_CUDA_MAP_HOST=off the mapping is refused.
TEST_F(CudaTest, QueriesInAMappedRegionAreReadInPlaceWithTheSameAnswers) {
  auto s = mlaserve::testing::BatchScenario::Make(Scenario("Model128HeadsLatentSplit").spec, 6);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok()) << built.status();
  // Each staged query moved into the region, 64-byte aligned as a client lays them out.
  int64_t bytes = 0;
  for (const StageCopy& c : built->steps.staging) {
    bytes += ((int64_t{c.rows} - 1) * c.src_stride + c.width) * 2 + 64;
  }
  const int fd = memfd_create("mlaserve-test-region", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, bytes), 0);
  void* region =
      mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(region, MAP_FAILED);
  BatchSteps moved = built->steps;
  int64_t at = 0;
  for (StageCopy& c : moved.staging) {
    const int64_t n = ((int64_t{c.rows} - 1) * c.src_stride + c.width) * 2;
    std::memcpy(static_cast<std::byte*>(region) + at, c.src, static_cast<size_t>(n));
    c.src = reinterpret_cast<const Bf16*>(static_cast<std::byte*>(region) + at);
    at += (n + 63) / 64 * 64;
  }
  {  // the executor and the inputs go before the runtime does
    auto inputs = mlaserve::testing::ResidentInputs::Upload(*runtime_, built->steps);
    ASSERT_TRUE(inputs.ok()) << inputs.status();
    gpu::GpuBatchExecutor executor(*runtime_, /*in_place_min_bytes=*/0);
    const auto answers = [&](const gpu::GpuBatchExecutor::Result& run) {
      return mlaserve::testing::AllOutputBytes(built->steps, *run.buffers);
    };
    auto uploaded = executor.Run(built->steps, inputs->resolver());
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
    const std::vector<std::byte> expected = answers(*uploaded);
    auto mapping = runtime_->MapHost(region, bytes);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    auto in_place = executor.Run(moved, inputs->resolver());
    ASSERT_TRUE(in_place.ok()) << in_place.status();
    EXPECT_EQ(in_place->query_bytes, 0);
    EXPECT_EQ(in_place->in_place_bytes, uploaded->query_bytes);
    EXPECT_TRUE(answers(*in_place) == expected);
    // A second GPU of a pool maps the same region (CUDA's registration is the process's):
    // here a second runtime of the same GPU, whose runs then read it in place too.
    auto second = CudaRuntime::Create(0, CudaOptions{});
    ASSERT_TRUE(second.ok()) << second.status();
    auto also = (*second)->MapHost(region, bytes);
    ASSERT_TRUE(also.ok()) << also.status();
    EXPECT_TRUE((*second)->ReadsInPlace(region, bytes));
    {
      auto second_inputs = mlaserve::testing::ResidentInputs::Upload(**second, built->steps);
      ASSERT_TRUE(second_inputs.ok()) << second_inputs.status();
      gpu::GpuBatchExecutor second_executor(**second, /*in_place_min_bytes=*/0);
      auto there = second_executor.Run(moved, second_inputs->resolver());
      ASSERT_TRUE(there.ok()) << there.status();
      EXPECT_EQ(there->in_place_bytes, uploaded->query_bytes);
      EXPECT_TRUE(answers(*there) == expected);
    }
    mapping->reset();  // the registering runtime's handle first, as a pool may let go
    also->reset();
    EXPECT_FALSE(runtime_->ReadsInPlace(region, bytes));
    EXPECT_TRUE((*second)->health().ok()) << (*second)->health();
    EXPECT_TRUE(runtime_->health().ok()) << runtime_->health();
  }
  Open(CudaOptions{.map_host = false});
  EXPECT_EQ(runtime_->MapHost(region, bytes).status().code(), absl::StatusCode::kUnimplemented);
  munmap(region, static_cast<size_t>(bytes));
}

// A GPU that faults is never trusted again: the fault's status, then every later call fails
// with it, and no answer comes back. (Each test runs in a process of its own: the trap ends
// this process's CUDA context.)
TEST_F(CudaTest, AFaultTakesTheDeviceOutForGood) {
  const NamedScenario scenario = mlaserve::testing::StandardBatchScenarios()[0];
  auto s = mlaserve::testing::BatchScenario::Make(scenario.spec, 5);
  auto built = BuildBatchSteps(s->batch());
  ASSERT_TRUE(built.ok());
  auto inputs = mlaserve::testing::ResidentInputs::Upload(*runtime_, built->steps);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  gpu::GpuBatchExecutor executor(*runtime_);
  ASSERT_TRUE(executor.Run(built->steps, inputs->resolver()).ok());

  const absl::Status trap = runtime_->InjectTrap();
  EXPECT_EQ(trap.code(), absl::StatusCode::kUnavailable) << trap;
  EXPECT_EQ(runtime_->health().code(), absl::StatusCode::kUnavailable);
  auto run = executor.Run(built->steps, inputs->resolver());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable) << run.status();
  EXPECT_THAT(std::string(run.status().message()), ::testing::HasSubstr("out of service"));
  EXPECT_EQ(runtime_->Allocate(1024, "after the fault").status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace mlaserve::cuda
