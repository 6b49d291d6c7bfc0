#ifndef MLASERVE_SERVER_ENGINE_PLAN_PLANNER_H_
#define MLASERVE_SERVER_ENGINE_PLAN_PLANNER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/engine_types.h"
#include "server/engine/kv/kv_store.h"
#include "server/engine/model/model_config.h"
#include "server/engine/model/model_weights.h"
#include "server/engine/plan/batch_plan.h"

namespace mlaserve::engine {

// The rates the TyphoonMLA threshold balances: matrix throughput T (FLOP/s) and memory
// bandwidth M (bytes/s) of the device that runs the batch.
struct DeviceRates {
  double matrix_flops = 0;
  double memory_bytes_per_second = 0;
  double fp8_matrix_flops = 0;  // on e4m3 operands; 0 when the matrix unit has none
  // The naive pass's own matrix rate where its math does not hide under its reads (a GPU
  // whose expanded-head kernel attains less than its latent one); 0: it hides (eq. 1).
  double naive_matrix_flops = 0;
};

// TyphoonMLA's break-even batch size (paper eq. 1; docs/engine.md, "Planner"): reading a prefix's
// expanded K/V once (naive) costs as much time as computing its absorb form for B queries when
//   B_theta = (Dqk + Dv) / (Sq (2 Dl + Dr)) * T / M.
// (The MAC-to-FLOP and element-to-byte factors of two cancel.) B Sq, the query tokens, is
// what the balance is about: B_theta(sq) = B_theta(1) / sq.
// Over an FP8 prefix on a matrix unit with an FP8 rate T8, the absorb form's content work
// (the 2 Dl of 2 Dl + Dr) runs at T8, so the naive pass competes with a cheaper absorb:
//   B_theta = (Dqk + Dv) / (Sq (2 Dl T / T8 + Dr)) * T / M,
// higher than bf16's. Without an FP8 rate the absorb costs what it costs in bf16 (its keys
// are widened first), and B_theta is bf16's.
// Where the naive pass's math costs time of its own (a rate Tn, not hidden under its reads),
// the prefix's naive pass takes N / M + B Sq N / Tn against the absorb's B A / T
// (N = Dqk + Dv, A = Sq (2 Dl + Dr)), so
//   B_theta = (N / M) / (A / T - Sq N / Tn),
// eq. 1 as Tn grows; infinite (absorb-only) once A / T <= Sq N / Tn.
double TyphoonBatchThreshold(const ModelConfig& model, int sq, const DeviceRates& rates,
                             KvDtype kv_dtype = KvDtype::kBf16);

struct PlannerOptions {
  // Tree-aware TyphoonMLA: a prefix level's naive pass is shared by every group whose
  // sequences start on it (on the prefix itself or on a child), and runs when all their
  // query tokens together reach B_theta(1). Flat: each group decides alone (its own members
  // against B_theta(sq)) and repeats the passes over the levels it shares with others.
  bool tree_aware = true;
  // TyphoonMLA's hybrid where it pays; false: every group absorb-only (B_theta infinite), so
  // that no prefix is ever expanded.
  bool hybrid = true;
};

// Groups a batch by (layer, shared prefix, sq, q space, KV format) and picks each group's
// formulation.
// A head-space group on a prefix runs the levels whose passes clear the threshold in naive
// form over their expanded K/V, and everything after them in absorb form (kHybrid); every
// other group, and any group whose expansions do not fit the memory budget, runs
// absorb-only.
class Planner {
 public:
  Planner(const ModelConfig& model, DeviceRates rates, int max_sq, PlannerOptions options = {});

  double BTheta(int sq, KvDtype kv_dtype = KvDtype::kBf16) const {
    return (kv_dtype == KvDtype::kFp8 ? b_theta_fp8_ : b_theta_)[sq - 1];
  }
  const std::vector<double>& BThetaBySq(KvDtype kv_dtype = KvDtype::kBf16) const {
    return kv_dtype == KvDtype::kFp8 ? b_theta_fp8_ : b_theta_;
  }

  // Plans the batch: snapshots (pinning what it reads), groups and passes, no expansion. A
  // query whose sequence cannot be snapshotted (released meanwhile) gets its status in
  // `failed` (by batch index) and is left out of every group. Cheap: runs on the batcher's
  // thread. `batch_invariant`: every group absorb-only (b_theta infinite), since whether a
  // prefix runs in naive form depends on how many queries of the batch share it.
  struct Result {
    BatchPlan plan;
    std::vector<std::pair<int, absl::Status>> failed;
  };
  Result Plan(KvStore& store, const std::vector<const DecodeQuery*>& queries,
              bool batch_invariant = false) const;

  // Builds (or finds) every pass's expansion: matrix work, so it runs on the device's thread.
  // A pass whose expansion does not fit (or whose prefix vanished) is dropped, and with it
  // every deeper pass of the groups that took it; those groups read the levels in absorb
  // form instead (always correct), absorb-only if no pass is left.
  void PrepareExpansions(BatchPlan& plan, KvStore& store, const ModelWeights& weights) const;

 private:
  std::vector<double> b_theta_;      // [sq - 1]
  std::vector<double> b_theta_fp8_;  // [sq - 1], groups on the FP8 cache
  PlannerOptions options_;
};

}  // namespace mlaserve::engine

#endif  // MLASERVE_SERVER_ENGINE_PLAN_PLANNER_H_
