#include "bench/sgemm_baseline.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "kernels/core/matmul.h"

namespace mlaserve::bench {

double MeasureSgemmBaselineGflops(const std::map<std::tuple<int, int, int>, int64_t>& shapes,
                                  int threads, int64_t max_calls_per_shape) {
  struct Call {
    int m, n, k;
  };
  std::vector<Call> calls;
  double flops = 0;
  for (const auto& [shape, count] : shapes) {
    const auto [m, n, k] = shape;
    for (int64_t i = 0; i < std::min(count, max_calls_per_shape); ++i) {
      calls.push_back({m, n, k});
      flops += 2.0 * m * n * k;
    }
  }
  if (calls.empty()) return 0;
  // Interleave shapes the way a kernel does, then deal calls round-robin to the threads.
  std::shuffle(calls.begin(), calls.end(), std::mt19937(1));
  auto worker = [&](int id) {
    std::vector<float> a(128 * 512, 0.5f), b(512 * 128, 0.25f), c(128 * 128);
    for (size_t i = id; i < calls.size(); i += threads) {
      const Call& x = calls[i];
      MatmulTileNT(x.m, x.n, x.k, a.data(), x.k, b.data(), x.k, c.data(), 128, i % 4 != 0);
    }
  };
  worker(0);  // warm up OpenBLAS buffers on this thread
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  for (std::thread& t : pool) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return flops / seconds / 1e9;
}

}  // namespace mlaserve::bench
