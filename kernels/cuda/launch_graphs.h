#ifndef MLASERVE_KERNELS_CUDA_LAUNCH_GRAPHS_H_
#define MLASERVE_KERNELS_CUDA_LAUNCH_GRAPHS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "kernels/gpu/gpu_program.h"

namespace mlaserve::cuda {

// The CUDA graphs of programs' launch sequences, by the launches' arguments: a decode step
// repeats its predecessor's launches exactly while its batch keeps its shape and its
// sequences stay within their pages (the launches read their per-call records from the
// upload, so only the records' addresses and the launch sizes are arguments). Replaying a
// graph costs one API call and no launch gaps where the sequence costs one per kernel.
//
// A sequence is captured at its second sight (one seen once may never come back), at most
// `capacity` graphs are kept, the least recently replayed dropped first. Used by one thread
// at a time, the one running its runtime's programs.
class LaunchGraphs {
 public:
  explicit LaunchGraphs(int capacity) : capacity_(capacity) {}
  ~LaunchGraphs();
  LaunchGraphs(const LaunchGraphs&) = delete;
  LaunchGraphs& operator=(const LaunchGraphs&) = delete;

  // What identifies a sequence: every argument of every launch but its name.
  static std::string Key(std::span<const gpu::Launch> launches);

  // The graph captured for `key`, or null.
  cudaGraphExec_t Find(const std::string& key);
  // Counts a sight of a sequence Find had no graph for; true when it is time to capture it.
  bool Sighted(const std::string& key);
  // Keeps `exec` (owned from now on) as `key`'s graph.
  void Insert(const std::string& key, cudaGraphExec_t exec);

  int size() const { return static_cast<int>(graphs_.size()); }

 private:
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;
  };

  const int capacity_;
  uint64_t clock_ = 0;
  absl::flat_hash_map<std::string, Graph> graphs_;
  absl::flat_hash_map<std::string, int> sightings_;
};

}  // namespace mlaserve::cuda

#endif  // MLASERVE_KERNELS_CUDA_LAUNCH_GRAPHS_H_
