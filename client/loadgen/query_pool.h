#ifndef MLASERVE_CLIENT_LOADGEN_QUERY_POOL_H_
#define MLASERVE_CLIENT_LOADGEN_QUERY_POOL_H_

#include <cstdint>
#include <span>
#include <vector>

#include "client/loadgen/load_target.h"

namespace mlaserve::loadgen {

// Queries and KV rows drawn from small pre-generated pools: generating fresh normals for
// 128-head queries would cost the client more CPU than the server spends on them.
class QueryPool {
 public:
  QueryPool(const TargetModel& model, int sq, uint64_t seed);

  // Query `k` of the pool (any k; it wraps) as a head- or latent-space query that appends
  // row `k` of the row pool at `position`.
  LoadQuery Query(int64_t k, const std::string& sequence_id, int layer, bool head_space,
                  int64_t position) const;

 private:
  static constexpr int kQueries = 16;
  static constexpr int kRows = 64;
  std::vector<Bf16> q_nope_, q_pe_, q_latent_, rows_;
  int64_t nope_ = 0, pe_ = 0, latent_ = 0;  // elements per query
  int dk_ = 0;
  int sq_ = 1;
};

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_QUERY_POOL_H_
