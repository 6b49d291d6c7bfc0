#include "bench/sgemm_baseline.h"

#include <algorithm>
#include <chrono>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cblas.h>

#include "kernels/core/matmul.h"

namespace mlaserve::bench {

std::string SgemmBaselineName() {
  return std::string("OpenBLAS ") + openblas_get_corename() + " kernels";
}

double MeasureSgemmBaselineGflops(const std::map<std::tuple<int, int, int>, int64_t>& shapes,
                                  int threads, int64_t max_calls_per_shape) {
  struct Call {
    int m, n, k;
  };
  std::vector<Call> calls;
  double flops = 0;
  int max_m = 0, max_n = 0, max_k = 0;
  for (const auto& [shape, count] : shapes) {
    const auto [m, n, k] = shape;
    for (int64_t i = 0; i < std::min(count, max_calls_per_shape); ++i) {
      calls.push_back({m, n, k});
      flops += 2.0 * m * n * k;
    }
    max_m = std::max(max_m, m);
    max_n = std::max(max_n, n);
    max_k = std::max(max_k, k);
  }
  if (calls.empty()) return 0;
  UseOneOpenBlasThreadPerCall();
  // Interleave shapes the way a kernel does, then deal calls round-robin to the threads.
  std::shuffle(calls.begin(), calls.end(), std::mt19937(1));
  threads = std::max(threads, 1);
  std::latch warm(threads + 1);
  std::latch go(1);
  std::latch done(threads);
  auto worker = [&](int id) {
    // Operands stay cache-resident: this is the ceiling, not a model of the kernel's traffic.
    std::vector<float> a(static_cast<size_t>(max_m) * max_k, 0.5f);
    std::vector<float> b(static_cast<size_t>(max_k) * max_n, 0.25f);
    std::vector<float> c(static_cast<size_t>(max_m) * max_n);
    auto run = [&](const Call& x, bool accumulate) {
      // The kernel's calls: C[m][n] (+)= A[m][k] B[k][n], row-major (kernels/core/matmul.h).
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, x.m, x.n, x.k, 1.0f, a.data(), x.k,
                  b.data(), x.n, accumulate ? 1.0f : 0.0f, c.data(), x.n);
    };
    for (size_t i = id; i < calls.size() && i < static_cast<size_t>(id + 8 * threads);
         i += threads) {
      run(calls[i], true);  // OpenBLAS's per-thread buffers, page faults, caches
    }
    warm.count_down();
    go.wait();
    for (size_t i = id; i < calls.size(); i += threads) run(calls[i], i % 4 != 0);
    done.count_down();
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  warm.arrive_and_wait();
  const auto start = std::chrono::steady_clock::now();
  go.count_down();
  done.wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (std::thread& t : pool) t.join();
  return flops / seconds / 1e9;
}

}  // namespace mlaserve::bench
