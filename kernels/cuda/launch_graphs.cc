#include "kernels/cuda/launch_graphs.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace mlaserve::cuda {
namespace {

template <typename T>
void Append(std::string& key, const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  key.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

}  // namespace

LaunchGraphs::~LaunchGraphs() {
  for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph.exec);
}

std::string LaunchGraphs::Key(std::span<const gpu::Launch> launches) {
  std::string key;
  key.reserve(launches.size() * 96);
  for (const gpu::Launch& l : launches) {
    Append(key, l.kind);
    Append(key, l.tiles);
    Append(key, l.count);
    Append(key, l.records);
    Append(key, l.gemv_rows);
    Append(key, l.aligned16);
    Append(key, l.keys);
    Append(key, l.dk);
    Append(key, l.dv);
    Append(key, l.softmax_scale);
    Append(key, l.max_tile_rows);
    Append(key, l.key_pool);
    Append(key, l.key_pool_rows);
    Append(key, l.key_row_stride);
  }
  return key;
}

cudaGraphExec_t LaunchGraphs::Find(const std::string& key) {
  auto it = graphs_.find(key);
  if (it == graphs_.end()) return nullptr;
  it->second.last_use = ++clock_;
  return it->second.exec;
}

bool LaunchGraphs::Sighted(const std::string& key) {
  // Sequences seen once are forgotten wholesale now and then: a stream of one-off shapes
  // must not grow the map.
  if (sightings_.size() >= static_cast<size_t>(capacity_) * 16) sightings_.clear();
  return ++sightings_[key] >= 2;
}

void LaunchGraphs::Insert(const std::string& key, cudaGraphExec_t exec) {
  sightings_.erase(key);
  if (graphs_.size() >= static_cast<size_t>(capacity_)) {
    auto oldest = std::min_element(
        graphs_.begin(), graphs_.end(),
        [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
    cudaGraphExecDestroy(oldest->second.exec);
    graphs_.erase(oldest);
  }
  Graph& graph = graphs_[key];
  if (graph.exec != nullptr) cudaGraphExecDestroy(graph.exec);
  graph.exec = exec;
  graph.last_use = ++clock_;
}

}  // namespace mlaserve::cuda
