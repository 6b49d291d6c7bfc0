#ifndef MLASERVE_SERVER_ENGINE_PLAN_PLANNER_H_
#define MLASERVE_SERVER_ENGINE_PLAN_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/plan/batch_plan.h"
#include "server/engine/engine_types.h"
#include "server/engine/kv/kv_store.h"
#include "server/engine/model/model_config.h"
#include "server/engine/model/model_weights.h"

namespace mlaserve::engine {

// The rates the TyphoonMLA threshold balances: matrix throughput T (FLOP/s) and memory
// bandwidth M (bytes/s) of the device that runs the batch.
struct DeviceRates {
  double matrix_flops = 0;
  double memory_bytes_per_second = 0;
};

// TyphoonMLA's break-even batch size (paper eq. 1, design §2.3): reading a prefix's expanded
// K/V once (naive) costs as much time as computing its absorb form for B queries when
//   B_theta = (Dqk + Dv) / (Sq (2 Dl + Dr)) * T / M.
// (The MAC-to-FLOP and element-to-byte factors of two cancel.)
double TyphoonBatchThreshold(const ModelConfig& model, int sq, const DeviceRates& rates);

// Groups a batch by (layer, shared prefix, sq, q space) and picks each group's formulation:
// a head-space group on a prefix with at least B_theta members runs naive over the prefix's
// expanded K/V plus absorb over each suffix (kHybrid); every other group, and any group whose
// expansion does not fit the memory budget, runs absorb-only.
class Planner {
 public:
  Planner(const ModelConfig& model, DeviceRates rates, int max_sq);

  double BTheta(int sq) const { return b_theta_[sq - 1]; }
  const std::vector<double>& BThetaBySq() const { return b_theta_; }

  // Plans the batch. A query whose sequence cannot be snapshotted (released meanwhile) gets
  // its status in `failed` (by batch index) and is left out of every group.
  struct Result {
    BatchPlan plan;
    std::vector<std::pair<int, absl::Status>> failed;
  };
  Result Plan(KvStore& store, const ModelWeights& weights,
              const std::vector<const DecodeQuery*>& queries) const;

 private:
  ModelConfig model_;
  std::vector<double> b_theta_;  // [sq - 1]
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_PLAN_PLANNER_H_
