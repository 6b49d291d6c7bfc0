#include "kernels/gpu/gpu_lowering.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/gpu/fake_gpu_runtime.h"
#include "kernels/gpu/gpu_batch_executor.h"
#include "kernels/mla/batch_step_builder.h"
#include "tests/testing/decode_batch_scenario.h"
#include "tests/testing/gpu_batch_checks.h"

namespace mlaserve::gpu {
namespace {

using mlaserve::testing::BatchScenario;
using mlaserve::testing::NamedScenario;
using ::testing::HasSubstr;

class GpuLoweringTest : public ::testing::TestWithParam<NamedScenario> {};

// Every standard batch through the GPU lowering, each launch executed by the fake GPU with
// the host kernels, against the fp64 golden: what the CUDA kernels run on a GPU is these
// launches with these records.
TEST_P(GpuLoweringTest, EveryStandardBatchMatchesTheGoldenOnTheFakeGpu) {
  FakeGpuRuntime runtime;
  mlaserve::testing::ExpectGpuBatchMatchesGolden(runtime, GetParam(), std::random_device{}());
}

// The model-shaped hybrid batches take seconds on the host kernels; the GPU suite runs them.
std::vector<NamedScenario> FakeGpuScenarios() {
  std::vector<NamedScenario> all;
  for (NamedScenario& s : mlaserve::testing::GpuScenarios()) {
    if (s.name.find("Model128HeadsHybrid") == std::string::npos) all.push_back(std::move(s));
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Batches, GpuLoweringTest, ::testing::ValuesIn(FakeGpuScenarios()),
                         [](const auto& param_info) { return param_info.param.name; });

BuiltBatch Built(const BatchScenario& s) {
  auto built = BuildBatchSteps(s.batch());
  EXPECT_TRUE(built.ok()) << built.status();
  return *std::move(built);
}

// The device never copies a batch's KV: an input the device does not hold fails the batch,
// naming the buffer, before anything runs.
TEST(GpuLoweringErrorsTest, AnInputTheDeviceDoesNotHoldFailsNamingIt) {
  auto s = BatchScenario::Make(mlaserve::testing::StandardBatchScenarios()[0].spec, 1);
  const BuiltBatch built = Built(*s);
  FakeGpuRuntime runtime;
  GpuBatchExecutor executor(runtime);
  auto run = executor.Run(built.steps, [](const StepBuffer&) -> absl::StatusOr<DevicePtr> {
    return absl::NotFoundError("not resident");
  });
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("KV pool"));
  EXPECT_EQ(runtime.programs_run(), 0);
}

// The CPU matrix unit's weight layout is not a GPU operand form: a batch built on it is
// refused naming the step, before anything runs (the engine hands a GPU kv_b_proj as loaded).
TEST(GpuLoweringErrorsTest, WeightsInTheCpuTileLayoutAreRefused) {
  mlaserve::testing::BatchScenarioSpec spec = mlaserve::testing::StandardBatchScenarios()[0].spec;
  spec.weight_tiles = true;
  auto s = BatchScenario::Make(spec, 4);
  const BuiltBatch built = Built(*s);
  FakeGpuRuntime runtime;
  auto inputs = mlaserve::testing::ResidentInputs::Upload(runtime, built.steps);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  GpuBatchExecutor executor(runtime);
  auto run = executor.Run(built.steps, inputs->resolver());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("absorb_q"));
  EXPECT_EQ(runtime.programs_run(), 0);
}

// A record naming memory outside what the device allocated is caught, not read: here the
// pool's device copy is one page short.
TEST(GpuLoweringErrorsTest, ARecordOutsideDeviceMemoryIsCaught) {
  auto s = BatchScenario::Make(mlaserve::testing::StandardBatchScenarios()[0].spec, 2);
  const BuiltBatch built = Built(*s);
  FakeGpuRuntime runtime;
  auto inputs = mlaserve::testing::ResidentInputs::Upload(runtime, built.steps);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  const InputResolver resident = inputs->resolver();
  auto small_pool = runtime.Allocate(256, "one page");
  ASSERT_TRUE(small_pool.ok());
  GpuBatchExecutor executor(runtime);
  auto run = executor.Run(built.steps, [&](const StepBuffer& b) -> absl::StatusOr<DevicePtr> {
    if (b.name == "KV pool") return *small_pool;
    return resident(b);
  });
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("outside device memory"));
}

// What crosses the bus for a batch: the queries once, the caller's copies once, and the
// records; the KV stays where it is, however long the sequences.
TEST(GpuLoweringTest, UploadsQueriesAndCopiesOnly) {
  const NamedScenario scenario = mlaserve::testing::StandardBatchScenarios()[0];
  auto s = BatchScenario::Make(scenario.spec, 3);
  const BuiltBatch built = Built(*s);
  int64_t query_bytes = 0;
  for (const StageCopy& c : built.steps.staging) query_bytes += int64_t{c.rows} * c.width * 2;

  FakeGpuRuntime runtime;
  auto inputs = mlaserve::testing::ResidentInputs::Upload(runtime, built.steps);
  ASSERT_TRUE(inputs.ok());
  // Two rows the caller wrote since the last batch, into a device buffer of their own.
  auto target = runtime.Allocate(4096, "rows");
  ASSERT_TRUE(target.ok());
  std::vector<std::byte> rows(2 * 1152);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::byte>(i * 7);
  const UploadCopy copy{rows.data(), *target + 512, static_cast<int64_t>(rows.size())};

  GpuBatchExecutor executor(runtime);
  const int64_t before = runtime.bytes_to_device();
  auto run = executor.Run(built.steps, inputs->resolver(), std::span(&copy, 1));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->query_bytes, query_bytes);
  EXPECT_EQ(run->copied_bytes, static_cast<int64_t>(rows.size()));
  EXPECT_EQ(runtime.bytes_to_device() - before, run->upload_bytes);
  // Records: a few hundred bytes per row group, nothing near a sequence's KV.
  int64_t kv_bytes = 0;
  for (const StepBuffer& b : built.steps.buffers) {
    if (b.kind == StepBuffer::Kind::kInput) kv_bytes += b.elements * ElementBytes(b.type);
  }
  EXPECT_LT(run->upload_bytes - run->query_bytes - run->copied_bytes, kv_bytes / 50);
  std::vector<std::byte> landed(rows.size());
  ASSERT_TRUE(
      runtime.CopyToHost(landed.data(), *target + 512, static_cast<int64_t>(landed.size())).ok());
  EXPECT_TRUE(landed == rows);
}

// Queries in host memory the device maps (a data plane's region) are read by the copy launch
// from where they are: none of them in the upload, the answers those of the uploaded run bit
// for bit; once the mapping is let go they are uploaded again. (This batch's queries are
// fewer bytes than kInPlaceMinBytes: the executor reads them in place from any size here,
// and a default one uploads them.)
TEST(GpuLoweringTest, QueriesInMappedHostMemoryAreReadInPlace) {
  const NamedScenario scenario = mlaserve::testing::StandardBatchScenarios()[0];
  auto s = BatchScenario::Make(scenario.spec, 3);
  const BuiltBatch built = Built(*s);
  ASSERT_FALSE(built.steps.staging.empty());
  int64_t query_bytes = 0;
  auto first = reinterpret_cast<uintptr_t>(built.steps.staging[0].src);
  uintptr_t last = first;
  for (const StageCopy& c : built.steps.staging) {
    query_bytes += int64_t{c.rows} * c.width * 2;
    const auto at = reinterpret_cast<uintptr_t>(c.src);
    first = std::min(first, at);
    last = std::max(last, at + static_cast<uintptr_t>(((c.rows - 1) * c.src_stride + c.width) * 2));
  }
  FakeGpuRuntime runtime;
  auto inputs = mlaserve::testing::ResidentInputs::Upload(runtime, built.steps);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  const auto answers = [&](const GpuBatchExecutor::Result& run) {
    return mlaserve::testing::AllOutputBytes(built.steps, *run.buffers);
  };
  GpuBatchExecutor executor(runtime, /*in_place_min_bytes=*/0);
  auto uploaded = executor.Run(built.steps, inputs->resolver());
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(uploaded->query_bytes, query_bytes);
  EXPECT_EQ(uploaded->in_place_bytes, 0);
  const std::vector<std::byte> expected = answers(*uploaded);
  uploaded->buffers.reset();

  const void* begin = reinterpret_cast<const void*>(first);
  const auto span = static_cast<int64_t>(last - first);
  {
    auto mapping = runtime.MapHost(begin, span);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    EXPECT_TRUE(runtime.ReadsInPlace(begin, span));
    EXPECT_FALSE(runtime.ReadsInPlace(begin, span + 1));
    auto in_place = executor.Run(built.steps, inputs->resolver());
    ASSERT_TRUE(in_place.ok()) << in_place.status();
    EXPECT_EQ(in_place->query_bytes, 0);
    EXPECT_EQ(in_place->in_place_bytes, query_bytes);
    EXPECT_LE(in_place->upload_bytes, uploaded->upload_bytes - query_bytes);
    EXPECT_TRUE(answers(*in_place) == expected);
    in_place->buffers.reset();
    ASSERT_LT(query_bytes, kInPlaceMinBytes);
    GpuBatchExecutor by_default(runtime);
    auto small = by_default.Run(built.steps, inputs->resolver());
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_EQ(small->in_place_bytes, 0);
    EXPECT_EQ(small->query_bytes, query_bytes);
  }
  EXPECT_FALSE(runtime.ReadsInPlace(begin, span));
  auto again = executor.Run(built.steps, inputs->resolver());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->query_bytes, query_bytes);
  EXPECT_EQ(again->in_place_bytes, 0);
  EXPECT_TRUE(answers(*again) == expected);
}

// The attention launches a kernel may feed with the bulk tensor copy: those whose every tile
// reads whole 64-key blocks of one bf16 pool name the pool as rows of keys; a launch with one
// tile starting mid-block (the absorb pass after a 700-token prefix) or on pages smaller than a
// block names nothing.
// A scenario's batch lowered with its inputs at made-up device addresses (nothing runs).
struct LoweredBatch {
  static constexpr DevicePtr kUploadAt = DevicePtr{1} << 30;
  BuiltBatch built;
  Program program;
  std::vector<std::byte> upload;
  // `count` records of `T` the lowering uploaded to `at`.
  template <class T>
  std::vector<T> Records(DevicePtr at, int64_t count) const {
    std::vector<T> records(static_cast<size_t>(count));
    std::memcpy(records.data(), upload.data() + (at - program.upload_to),
                records.size() * sizeof(T));
    return records;
  }
  template <class Tile>
  std::vector<Tile> Tiles(const Launch& l) const {
    return Records<Tile>(l.tiles, l.count);
  }
  // Where the lowering was told each input is.
  DevicePtr InputAddress(const StepBuffer& b) const {
    return (DevicePtr{1} << 40) +
           static_cast<DevicePtr>(&b - built.steps.buffers.data()) * (DevicePtr{1} << 32);
  }
};

LoweredBatch Lowered(const NamedScenario& scenario) {
  auto s = BatchScenario::Make(scenario.spec, 4);
  LoweredBatch lowered{Built(*s), {}, {}};
  const BatchSteps& steps = lowered.built.steps;
  auto layout = LayOutBatch(steps);
  EXPECT_TRUE(layout.ok()) << layout.status();
  lowered.upload.resize(static_cast<size_t>(layout->upload_bytes));
  const auto resolve = [&](const StepBuffer& b) -> absl::StatusOr<DevicePtr> {
    return lowered.InputAddress(b);
  };
  auto program = LowerBatch(steps, *layout, LoweredBatch::kUploadAt, resolve, lowered.upload);
  EXPECT_TRUE(program.ok()) << program.status();
  if (program.ok()) lowered.program = *std::move(program);
  return lowered;
}

Launch OnlyPagedAttention(const NamedScenario& scenario) {
  const LoweredBatch lowered = Lowered(scenario);
  const BuiltBatch& built = lowered.built;
  const Program* program = &lowered.program;
  std::vector<Launch> paged;
  for (const Launch& l : program->launches) {
    if (l.kind == LaunchKind::kAttention && l.keys == KeysKind::kPagedBf16) paged.push_back(l);
  }
  EXPECT_EQ(paged.size(), 1u) << scenario.name;
  if (paged.empty()) return Launch{};
  // The pool's address and size as the resolver and the steps have them.
  for (const StepBuffer& b : built.steps.buffers) {
    if (b.name != "KV pool") continue;
    if (paged[0].key_pool_rows > 0) {
      EXPECT_EQ(paged[0].key_pool, lowered.InputAddress(b));
      EXPECT_EQ(paged[0].key_pool_rows, b.elements / 576);
      EXPECT_EQ(paged[0].key_row_stride, 576 * 2);
    }
  }
  return paged[0];
}

NamedScenario Named(const std::string& name) {
  for (NamedScenario& s : mlaserve::testing::StandardBatchScenarios()) {
    if (s.name == name) return s;
  }
  ADD_FAILURE() << "no scenario " << name;
  return mlaserve::testing::StandardBatchScenarios()[0];
}

TEST(GpuLoweringTest, AttentionOverWholeKeyBlocksNamesThePool) {
  EXPECT_GT(OnlyPagedAttention(Named("AbsorbHead")).key_pool_rows, 0);   // pages of 64
  EXPECT_GT(OnlyPagedAttention(Named("Latent")).key_pool_rows, 0);       // pages of 128
  EXPECT_GT(OnlyPagedAttention(Named("SplitLatent")).key_pool_rows, 0);  // parts of blocks
  EXPECT_EQ(OnlyPagedAttention(Named("HybridOneLevel")).key_pool_rows, 0);
  NamedScenario small_pages = Named("AbsorbHead");
  small_pages.spec.page_size = 32;
  EXPECT_EQ(OnlyPagedAttention(small_pages).key_pool_rows, 0);
}

// An attention launch states the most rows any of its tiles holds (a sequence's heads x sq, at
// most a tile's 64), by which a runtime picks a kernel for few rows.
TEST(GpuLoweringTest, AttentionLaunchesStateTheirLargestTile) {
  EXPECT_EQ(OnlyPagedAttention(Named("AbsorbHead")).max_tile_rows, 8);          // 8 heads
  EXPECT_EQ(OnlyPagedAttention(Named("AbsorbHeadMtpBf16")).max_tile_rows, 16);  // sq 2
  EXPECT_EQ(OnlyPagedAttention(Named("SplitLatentHostParts")).max_tile_rows, 24);
  NamedScenario wide = Named("Latent");
  wide.spec.heads = 100;  // 100 rows: a tile of 64 and one of 36
  EXPECT_EQ(OnlyPagedAttention(wide).max_tile_rows, 64);
}

// A dense launch's tiles come in pairs of one row group, the second empty where the group has
// an odd number (gpu_jobs.h): a naive pass of 3 queries a head (one tile and an empty one) and
// of 66 (two tiles of the same keys).
TEST(GpuLoweringTest, DenseTilesComeInPairsOfOneRowGroup) {
  NamedScenario many;
  for (NamedScenario& s : mlaserve::testing::GpuScenarios()) {
    if (s.name == "HybridManyQueries") many = s;
  }
  ASSERT_FALSE(many.name.empty());
  for (const NamedScenario& scenario : {Named("HybridOneLevel"), many}) {
    SCOPED_TRACE(scenario.name);
    const LoweredBatch lowered = Lowered(scenario);
    int dense = 0, full_pairs = 0, empty_seconds = 0;
    for (const Launch& l : lowered.program.launches) {
      if (l.kind != LaunchKind::kAttention || l.keys != KeysKind::kDense) continue;
      ++dense;
      ASSERT_EQ(l.count % 2, 0);
      const std::vector<AttentionTile> tiles = lowered.Tiles<AttentionTile>(l);
      for (size_t i = 0; i < tiles.size(); i += 2) {
        const AttentionTile &a = tiles[i], &b = tiles[i + 1];
        EXPECT_GT(a.rows, 0);
        EXPECT_EQ(b.base, a.base);
        EXPECT_EQ(b.values, a.values);
        EXPECT_EQ(b.ldk, a.ldk);
        EXPECT_EQ(b.ldv, a.ldv);
        if (b.rows == 0) {
          EXPECT_EQ(b.keys, 0);
          ++empty_seconds;
        } else {
          EXPECT_EQ(b.q, a.q + static_cast<DevicePtr>(int64_t{a.rows} * l.dk * 2));
          ++full_pairs;
        }
      }
    }
    EXPECT_GT(dense, 0);
    if (scenario.name == "HybridOneLevel") {
      EXPECT_EQ(full_pairs, 0);
      EXPECT_GT(empty_seconds, 0);
    } else {
      EXPECT_GT(full_pairs, 0);
    }
  }
}

// A merge's tiles cover each of its rows' columns once, in slices of kCombineSliceColumns so
// that a few rows of many parts still make many thread blocks; a merge into its first part's
// own LSEs (in place) keeps whole rows, as every slice reads every part's LSE.
TEST(GpuLoweringTest, CombineTilesCoverEveryColumnOnceInSlicesUnlessInPlace) {
  int merges = 0, sliced = 0;
  for (const NamedScenario& scenario : FakeGpuScenarios()) {
    SCOPED_TRACE(scenario.name);
    const LoweredBatch lowered = Lowered(scenario);
    for (const Launch& l : lowered.program.launches) {
      if (l.kind != LaunchKind::kCombine) continue;
      const std::vector<CombineTile> tiles = lowered.Tiles<CombineTile>(l);
      int jobs = 0;
      for (const CombineTile& t : tiles) jobs = std::max(jobs, t.job + 1);
      const std::vector<CombineJob> records = lowered.Records<CombineJob>(l.records, jobs);
      for (int index = 0; index < jobs; ++index) {
        const CombineJob& job = records[static_cast<size_t>(index)];
        const std::vector<CombinePart> parts =
            lowered.Records<CombinePart>(job.parts, job.num_parts);
        const bool in_place = std::any_of(parts.begin(), parts.end(),
                                          [&](const CombinePart& p) { return p.lse == job.lse; });
        std::vector<int> covered(static_cast<size_t>(job.rows) * job.dv, 0);
        for (const CombineTile& t : tiles) {
          if (t.job != index) continue;
          EXPECT_EQ(t.row0 % kCombineTileRows, 0);
          EXPECT_EQ(t.cols, in_place ? job.dv : std::min(job.dv, kCombineSliceColumns));
          sliced += t.cols < job.dv ? 1 : 0;
          for (int r = t.row0; r < std::min(job.rows, t.row0 + kCombineTileRows); ++r) {
            for (int c = t.col0; c < t.col0 + t.cols && c < job.dv; ++c) {
              ++covered[static_cast<size_t>(r) * job.dv + c];
            }
          }
        }
        EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), std::ssize(covered));
        ++merges;
      }
    }
  }
  EXPECT_GT(merges, 0);
  EXPECT_GT(sliced, 0);
}

// The projections of a few sequences name the row kernel with their rows (a head's job has a
// row per query row); more rows than it takes name none.
std::vector<Launch> GemmLaunches(const NamedScenario& scenario) {
  std::vector<Launch> gemms;
  for (const Launch& l : Lowered(scenario).program.launches) {
    if (l.kind == LaunchKind::kGemm) gemms.push_back(l);
  }
  return gemms;
}

TEST(GpuLoweringTest, FewRowsProjectionsNameTheRowKernel) {
  const std::vector<Launch> three = GemmLaunches(Named("AbsorbHead"));  // 3 sequences, sq 1
  ASSERT_EQ(three.size(), 2u);
  EXPECT_EQ(three[0].name, "absorb_q");
  EXPECT_EQ(three[1].name, "project_out");
  for (const Launch& l : three) EXPECT_EQ(l.gemv_rows, 3) << l.name;
  NamedScenario four = Named("AbsorbHead");
  four.spec.groups[0].own_tokens = {1, 2, 3, 4};
  for (const Launch& l : GemmLaunches(four)) EXPECT_EQ(l.gemv_rows, 4) << l.name;
  // 3 sequences of 2 query tokens: 6 rows a head.
  for (const Launch& l : GemmLaunches(Named("AbsorbHeadMtpBf16"))) {
    EXPECT_EQ(l.gemv_rows, 0) << l.name;
  }
}

// A caller that keeps each run's answers while running the next (a benchmark alternating two
// batches) gets a fresh host buffer each time, of the size the run needs: not one half as
// large again as the last, which grew the pinned memory geometrically.
TEST(GpuBatchExecutorTest, ResultsKeptAcrossRunsDoNotGrowTheHostBuffers) {
  FakeGpuRuntime runtime;
  auto s = BatchScenario::Make(Named("Latent").spec, 4);
  const BuiltBatch built = Built(*s);
  auto inputs = mlaserve::testing::ResidentInputs::Upload(runtime, built.steps);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  GpuBatchExecutor executor(runtime);
  std::vector<GpuBatchExecutor::Result> kept;
  for (int run = 0; run < 12; ++run) {
    auto result = executor.Run(built.steps, inputs->resolver());
    ASSERT_TRUE(result.ok()) << result.status();
    kept.push_back(*std::move(result));
  }
  const int64_t needed = std::max(kept[0].upload_bytes, kept[0].download_bytes);
  EXPECT_LE(runtime.largest_host_allocation(), 2 * needed);
}

// The row kernel sums in another order than the tiled GEMM, so which one a row meets must not
// depend on the batch: in the batch-invariant mode every projection takes the tiled GEMM.
TEST(GpuLoweringTest, BatchInvariantProjectionsStayOnTheTiledGemm) {
  NamedScenario invariant = Named("AbsorbHead");
  invariant.spec.batch_invariant = true;
  const std::vector<Launch> launches = GemmLaunches(invariant);
  ASSERT_EQ(launches.size(), 2u);
  for (const Launch& l : launches) EXPECT_EQ(l.gemv_rows, 0) << l.name;
}

// The batch-invariance check on the fake GPU, split over its SMs as the engine's GPU device
// splits: a query's answer in batches of 2 to 256 is the one it gets alone.
TEST(GpuBatchInvarianceTest, AQueryAnswersInAnyBatchAsItDoesAlone) {
  FakeGpuRuntime runtime;
  mlaserve::testing::ExpectBatchInvariant(mlaserve::testing::GpuBatchRunner(runtime),
                                          mlaserve::testing::InvarianceScenario(8, false),
                                          std::random_device{}());
}

}  // namespace
}  // namespace mlaserve::gpu
