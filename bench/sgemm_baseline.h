#ifndef MLASERVE_BENCH_SGEMM_BASELINE_H_
#define MLASERVE_BENCH_SGEMM_BASELINE_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace mlaserve::bench {

// Which OpenBLAS kernels the baseline runs, e.g. "OpenBLAS Haswell kernels": OpenBLAS picks
// them from the CPU it detects, and OPENBLAS_CORETYPE overrides that (docs/performance.md).
std::string SgemmBaselineName();

// OpenBLAS's SGEMM rate (GFLOP/s) on exactly the matrix-unit calls a launch made: each
// (m, n, k) tile shape with its multiplicity (capped per shape to bound the run), spread over
// `threads` warmed-up host threads like the emulator spreads its cores, operands cache-hot.
// This is the ceiling the emulator's host execution is compared against; the emulator
// itself runs the same calls as oneDNN bf16 matmuls (kernels/core/matmul.h).
double MeasureSgemmBaselineGflops(const std::map<std::tuple<int, int, int>, int64_t>& shapes,
                                  int threads, int64_t max_calls_per_shape = 2000);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_SGEMM_BASELINE_H_
