#ifndef MLASERVE_BENCH_SGEMM_BASELINE_H_
#define MLASERVE_BENCH_SGEMM_BASELINE_H_

#include <cstdint>
#include <map>
#include <tuple>

namespace mlaserve::bench {

// The host's SGEMM rate (GFLOP/s) on exactly the matrix-unit calls a launch made: each
// (m, n, k) tile shape with its multiplicity (capped per shape to bound the run), spread
// over `threads` host threads like the emulator spreads its cores. This is the ceiling the
// emulator's host execution is compared against.
double MeasureSgemmBaselineGflops(const std::map<std::tuple<int, int, int>, int64_t>& shapes,
                                  int threads, int64_t max_calls_per_shape = 400);

}  // namespace mlaserve::bench

#endif  // MLASERVE_BENCH_SGEMM_BASELINE_H_
