#ifndef MLASERVE_CLIENT_LOADGEN_WORKLOAD_H_
#define MLASERVE_CLIENT_LOADGEN_WORKLOAD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/loadgen/load_target.h"
#include "client/loadgen/progress.h"

namespace mlaserve::loadgen {

// A closed-loop decode load shaped like serving frameworks drive the service: `workers`
// independent callers (framework ranks), each holding `sequences` sequences that start on
// one shared system prompt and carry a prompt of their own; every step, each worker makes
// one Decode call per layer carrying all its sequences, each query appending the step's new
// KV row first. A worker's next call leaves when its previous answer arrives.
struct WorkloadOptions {
  int workers = 2;
  int sequences = 72;               // per worker, all in every call
  int prefix_tokens = 1024;         // shared by every sequence (0: no prefix)
  int context_tokens = 128;         // each sequence's own tokens before the first step
  int sq = 1;                       // query tokens per query (MTP)
  bool head_space = true;           // q_nope/q_pe (false: latent q, FlashMLA style)
  int layers = 0;                   // layers each step visits (0: all the target serves)
  std::optional<KvDtype> kv_dtype;  // the prefix's and sequences' format (unset: the server's)
  absl::Duration duration = absl::Seconds(10);
  uint64_t seed = 1;
  std::string run_id = "loadgen";  // prefixes every id, so runs never collide
  // How the calls travel, for the report: grpc, packed, shm (what --transport=auto found).
  std::string transport = "grpc";
  Progress* progress = nullptr;  // told of every call, if set
};

// One Decode call as the worker saw it.
struct CallRecord {
  double start_s = 0;     // since the run started
  double latency_us = 0;  // client-observed, call to answer
  int queries = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  // A worker's first step: it pays for first-touch costs (the prefix's expansion on first
  // use), so the summary leaves it out.
  bool warmup = false;
  std::vector<LoadAnswer> answers;  // empty unless OK
};

struct LoadResult {
  WorkloadOptions options;
  TargetModel model;
  double wall_s = 0;   // first call sent to last answer
  int64_t tokens = 0;  // sequence-steps completed (every layer answered)
  std::vector<CallRecord> calls;
};

// Sets the workload up on `target`, runs it for options.duration, and releases everything it
// created (also on failure).
absl::StatusOr<LoadResult> RunWorkload(LoadTarget& target, const WorkloadOptions& options);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_WORKLOAD_H_
