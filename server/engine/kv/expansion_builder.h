#ifndef MLASERVE_SERVER_ENGINE_KV_EXPANSION_BUILDER_H_
#define MLASERVE_SERVER_ENGINE_KV_EXPANSION_BUILDER_H_

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "kernels/core/kv_dtype.h"
#include "server/engine/kv/expanded_kv.h"
#include "server/engine/kv/page_pool.h"
#include "server/engine/model/model_weights.h"

namespace mlaserve::engine {

// Builds a prefix level's naive-form K/V (expanded_kv.h) where a device keeps them: a GPU
// computes them from its copy of the pool and holds them in its own memory. The store calls
// it outside its lock, once per (prefix, layer), and keeps what it returns like any other
// expansion (counted in the budget, evictable when unpinned, freed with its prefix). Without
// one the store expands on the host (ExpandedKvData::Build).
class ExpansionBuilder {
 public:
  virtual ~ExpansionBuilder() = default;

  struct Request {
    KvDtype dtype = KvDtype::kBf16;  // the format of the prefix's pages
    std::span<const int32_t> pages;  // the prefix's block table for the layer, from token 0
    int32_t begin = 0;               // the level's tokens [begin, end)
    int32_t end = 0;
    int layer = 0;
  };
  // RESOURCE_EXHAUSTED when the device has no room: the planner then reads those keys in
  // absorb form. Any other error is the device's.
  virtual absl::StatusOr<std::unique_ptr<ExpandedKvData>> Build(const PagePool& pool,
                                                                const Request& request,
                                                                const ModelWeights& weights) = 0;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_KV_EXPANSION_BUILDER_H_
