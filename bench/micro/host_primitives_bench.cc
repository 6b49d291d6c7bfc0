// mlaserve-microbench: the host primitives the emulated device spends its time in, each
// beside the alternative it replaced or competes with, in one run (compare ratios, not
// absolute times: these machines are shared). Results: docs/performance.md.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <string_view>
#include <vector>

#include <cblas.h>

#include "benchmark/benchmark.h"
#include "common/command_line.h"
#include "kernels/core/bfloat16.h"
#include "kernels/core/cpu_features.h"
#include "kernels/core/matmul.h"
#include "kernels/core/random_fill.h"
#include "kernels/core/row_matmul.h"
#include "kernels/core/vector_ops.h"
#include "kernels/mla/amla.h"

namespace mlaserve {
namespace {

// One softmax block of a task: 256 rows x 512 keys of scores.
constexpr int kBlock = 256 * 512;

std::vector<float> Scores(int n) {
  std::vector<Bf16> b(n);
  Rng rng(1);
  FillNormal(b, 3.0, rng);
  std::vector<float> x(n);
  WidenBf16(b.data(), n, x.data());
  return x;
}

void BM_ExpShifted_Sleef(benchmark::State& state) {
  const std::vector<float> x = Scores(kBlock);
  std::vector<float> y(kBlock);
  for (auto _ : state) {
    ExpShifted(x.data(), kBlock, 4.0f, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}
BENCHMARK(BM_ExpShifted_Sleef);

void BM_ExpShifted_ScalarLibm(benchmark::State& state) {
  const std::vector<float> x = Scores(kBlock);
  std::vector<float> y(kBlock);
  for (auto _ : state) {
    for (int j = 0; j < kBlock; ++j) y[j] = std::exp(x[j] - 4.0f);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}
BENCHMARK(BM_ExpShifted_ScalarLibm);

void BM_RowMax_Lanes(benchmark::State& state) {
  const std::vector<float> x = Scores(kBlock);
  for (auto _ : state) {
    float m = 0;
    for (int r = 0; r < 256; ++r) m += RowMax(x.data() + r * 512, 512);
    benchmark::DoNotOptimize(m);
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}
BENCHMARK(BM_RowMax_Lanes);

void BM_RowMax_RunningMax(benchmark::State& state) {
  const std::vector<float> x = Scores(kBlock);
  for (auto _ : state) {
    float total = 0;
    for (int r = 0; r < 256; ++r) {
      float m = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < 512; ++j) m = std::max(m, x[r * 512 + j]);
      total += m;
    }
    benchmark::DoNotOptimize(total);
  }
  state.SetItemsProcessed(state.iterations() * kBlock);
}
BENCHMARK(BM_RowMax_RunningMax);

// A 512-key block of latent K (576 wide) widened to fp32: what the host kernels'
// KvBlockSource pays per block (the emulated device keeps bf16 in L1 and pays none).
void BM_WidenBf16_KBlock(benchmark::State& state) {
  constexpr int n = 512 * 576;
  std::vector<Bf16> in(n);
  Rng rng(2);
  FillNormal(in, 1.0, rng);
  std::vector<float> out(n);
  for (auto _ : state) {
    WidenBf16(in.data(), n, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * n * 2);
}
BENCHMARK(BM_WidenBf16_KBlock);

// The matrix unit's host work for one 128 x 128 output tile of Q K^T (depth 96) and of P V
// (depth 128): oneDNN's bf16 matmul, which mlaserve uses (operands as L1 holds them: compact
// bf16), beside OpenBLAS SGEMM on the same tile in fp32, with the FLOP rate of each.
template <typename Multiply>
void RunMatmulTile(benchmark::State& state, Multiply multiply) {
  const int k = static_cast<int>(state.range(0));
  for (auto _ : state) multiply(k);
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * 128 * 128 * k * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
}

// The matrix unit's tile call (MLASERVE_MATRIX_UNIT picks among its paths: docs/emulator.md).
void BM_MatmulTile_MatrixUnit(benchmark::State& state) {
  state.SetLabel(MatrixUnitBackend());
  const int k = static_cast<int>(state.range(0));
  std::vector<Bf16> a(128 * k, Bf16::FromFloat(0.5f)), b(128 * k, Bf16::FromFloat(0.25f));
  std::vector<float> c(128 * 128);
  RunMatmulTile(state, [&](int depth) {
    MatmulTileNN(128, 128, depth, a.data(), b.data(), c.data());
    benchmark::DoNotOptimize(c.data());
  });
}
BENCHMARK(BM_MatmulTile_MatrixUnit)->Arg(96)->Arg(128);

void BM_MatmulTile_OpenBlasSgemm(benchmark::State& state) {
  UseOneOpenBlasThreadPerCall();
  const int k = static_cast<int>(state.range(0));
  std::vector<float> a(128 * k, 0.5f), b(128 * k, 0.25f), c(128 * 128);
  RunMatmulTile(state, [&](int depth) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 128, 128, depth, 1.0f, a.data(), depth,
                b.data(), 128, 1.0f, c.data(), 128);
    benchmark::DoNotOptimize(c.data());
  });
}
BENCHMARK(BM_MatmulTile_OpenBlasSgemm)->Arg(96)->Arg(128);

// One query's up-projection as the cube runs it: a 128 x 128 weight tile per MMAD with m = 1
// to 16 query rows, the weights streamed (a layer's W_UK, 16 MiB, each tile read once as
// serving reads it) or one tile kept in cache; bytes are the weights'. The library's tile
// call beside the row kernel the matrix unit takes for up to 8 rows.
template <typename Multiply>
void RunSmallRows(benchmark::State& state, Multiply multiply) {
  const int m = static_cast<int>(state.range(0));
  const bool stream = state.range(1) != 0;
  constexpr int kTiles = 512;  // 128 heads x 4 output tiles of W_UK [128][512]
  std::vector<Bf16> a(128 * 128, Bf16::FromFloat(0.5f));
  std::vector<Bf16> b(static_cast<size_t>(stream ? kTiles : 1) * 128 * 128);
  Rng rng(3);
  FillNormal(b, 1.0, rng);
  std::vector<float> c(128 * 128);
  for (auto _ : state) {
    for (int t = 0; t < kTiles; ++t) {
      multiply(m, a.data(), b.data() + (stream ? t * 128 * 128 : 0), c.data());
    }
    benchmark::DoNotOptimize(c.data());
  }
  state.SetBytesProcessed(state.iterations() * kTiles * 128 * 128 * 2);
  state.SetItemsProcessed(state.iterations() * kTiles);
}
void BM_MatmulTileLibrary_SmallRows(benchmark::State& state) {
  RunSmallRows(state, [](int m, const Bf16* a, const Bf16* b, float* c) {
    MatmulTileLibraryNN(m, 128, 128, a, b, c);
  });
}
BENCHMARK(BM_MatmulTileLibrary_SmallRows)->ArgsProduct({{1, 2, 4, 8, 16}, {0, 1}});

void BM_RowMatmul_SmallRows(benchmark::State& state) {
  RunSmallRows(state, [](int m, const Bf16* a, const Bf16* b, float* c) {
    RowMatmulNN(m, 128, 128, a, b, c, 128);
  });
}
BENCHMARK(BM_RowMatmul_SmallRows)->ArgsProduct({{1, 2, 4, 8}, {0, 1}});

// Validation's finiteness scan over the query bytes of a 72-query head-space Decode
// (72 x 128 heads x 192 values), chunked and vectorised beside the plain early-exit loop.
constexpr int kDecodeQueryValues = 72 * 128 * 192;

std::vector<Bf16> FiniteQueries() {
  std::vector<Bf16> q(kDecodeQueryValues);
  Rng rng(2);
  FillNormal(q, 1.0, rng);
  return q;
}

void BM_FiniteScan_Chunked(benchmark::State& state) {
  const std::vector<Bf16> q = FiniteQueries();
  for (auto _ : state) benchmark::DoNotOptimize(FirstNonFinite(q));
  state.SetBytesProcessed(state.iterations() * kDecodeQueryValues * 2);
}
BENCHMARK(BM_FiniteScan_Chunked);

void BM_FiniteScan_EarlyExitLoop(benchmark::State& state) {
  const std::vector<Bf16> q = FiniteQueries();
  for (auto _ : state) {
    size_t i = 0;
    while (i < q.size() && q[i].IsFinite()) ++i;
    benchmark::DoNotOptimize(i);
  }
  state.SetBytesProcessed(state.iterations() * kDecodeQueryValues * 2);
}
BENCHMARK(BM_FiniteScan_EarlyExitLoop);

// The host AMLA row kernel on one row group: 128 rows (DeepSeek-V3's heads, one token)
// over 4096 keys of a paged latent cache, read in place as bf16 rows.
void BM_AmlaRows_Host(benchmark::State& state) {
  constexpr int kRows = 128, kKeys = 4096, kWidth = 576, kPage = 128;
  std::vector<Bf16> pool(static_cast<size_t>(kKeys) * kWidth),
      q16(static_cast<size_t>(kRows) * kWidth);
  Rng rng(3);
  FillNormal(pool, 1.0, rng);
  FillNormal(q16, 1.0, rng);
  std::vector<float> q(q16.size());
  WidenBf16(q16.data(), static_cast<int64_t>(q16.size()), q.data());
  std::vector<int32_t> table(kKeys / kPage);
  for (int i = 0; i < kKeys / kPage; ++i) table[i] = i;
  const int32_t seqlen = kKeys;
  const PagedKvCache cache{*TensorView<const Bf16, 3>::Create(std::span<const Bf16>(pool),
                                                              {kKeys / kPage, kPage, kWidth})};
  const PagedSequences seqs{
      *TensorView<const int32_t, 2>::Create(std::span<const int32_t>(table), {1, kKeys / kPage}),
      std::span<const int32_t>(&seqlen, 1)};
  std::vector<int32_t> visible(kRows, kKeys);
  std::vector<float> out(static_cast<size_t>(kRows) * 512), lse(kRows);
  for (auto _ : state) {
    PagedLatentSource source(cache, seqs, 0, 512);
    AmlaRows(QueryRows{q.data(), kWidth, kRows, kWidth, visible}, source, 0.07f, AmlaOptions{},
             RowOutputs{out.data(), 512, lse.data()});
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["FLOPS"] = benchmark::Counter(
      2.0 * kRows * kKeys * (kWidth + 512) * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AmlaRows_Host)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace mlaserve

namespace {

void PrintHelp() {
  std::cout << "mlaserve-microbench [--benchmark_filter=REGEX] [flags]: the host primitives the "
               "emulated device spends its time in, each beside its alternative "
               "(docs/performance.md)\n\ngoogle-benchmark's flags:\n";
  std::cout.flush();
  benchmark::PrintDefaultHelp();
  std::fflush(stdout);
  std::cout << "  --help, --version\n      print this, or the version, and exit\n";
}

}  // namespace

// google-benchmark's own header names the CPU's cache sizes but not its ISA; the context
// lines name what the numbers came from.
int main(int argc, char** argv) {
  // --version as every mlaserve binary answers it. google-benchmark has no such flag and, as
  // it ignores arguments it does not know, would run every benchmark instead.
  for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i) {
    if (std::string_view(argv[i]) == "--version") {
      std::cout << mlaserve::VersionLine(argv[0], mlaserve::MatrixPathDescription) << "\n";
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv, PrintHelp);
  // An unknown flag (a misspelt --benchmark_filter, say) is an error, not a full run.
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("cpu", mlaserve::HostCpu().model);
  benchmark::AddCustomContext("isa", mlaserve::HostCpu().MatrixIsa());
  benchmark::AddCustomContext("matrix_unit", mlaserve::MatrixUnitBackend());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
