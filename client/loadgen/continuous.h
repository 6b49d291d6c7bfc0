#ifndef MLASERVE_CLIENT_LOADGEN_CONTINUOUS_H_
#define MLASERVE_CLIENT_LOADGEN_CONTINUOUS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/loadgen/load_target.h"
#include "client/loadgen/progress.h"
#include "client/loadgen/traffic_model.h"
#include "client/loadgen/workload.h"

namespace mlaserve::loadgen {

// Traffic as a serving framework makes it: sequences arrive (a Gamma renewal process, or a
// closed population topped up as they finish), each starting on one of the system prompts
// with an own prompt and a number of decode steps drawn from their distributions. Every rank
// (one Decode call in flight) holds up to `sequences` of them and, as a framework's scheduler
// does, decodes all it holds in one call per layer per step, admits waiting arrivals between
// steps (creating the sequence and appending its own prompt: the prefill's KV) and retires
// those that have taken their steps. Arrivals that find every rank full wait in one queue.
struct ContinuousOptions {
  int ranks = 2;
  int sequences = 32;  // most a rank holds; in a closed population, what it always holds
  ArrivalProcess arrivals;
  LengthDistribution context;  // own prompt tokens
  LengthDistribution steps;    // decode steps (output tokens) per sequence
  PromptMix prompts;
  int sq = 1;
  bool head_space = true;
  int layers = 0;  // layers each step visits (0: all the target serves)
  std::optional<KvDtype> kv_dtype;
  absl::Duration warmup = absl::Seconds(2);  // run, then left out of every figure
  absl::Duration duration = absl::Seconds(10);
  uint64_t seed = 1;
  std::string run_id = "loadgen";
  Progress* progress = nullptr;
};

// One sequence's life. Times in seconds since the run started.
struct SequenceRecord {
  double arrived_s = 0;
  double admitted_s = -1;  // created and its prompt appended; -1 if it never was
  double finished_s = -1;  // took its last step; -1 if the run ended first
  int prompt = -1;         // index into the PromptMix, -1 for none
  int context_tokens = 0;
  int planned_steps = 0;
  int steps = 0;
  // Its steps' times. A step is the rank's loop around once: admitting newcomers (their
  // prompts' KV, as a prefill interrupts decode), then every layer's call one after another.
  double step_ms_sum = 0;
  bool abandoned = false;  // retired unfinished after a failed call
};

// A sequence the server refused at admission (CreateSequence or AppendKv failed).
struct AdmissionError {
  double t_s = 0;
  std::string code;
};

// One step of one rank: every layer's Decode call for all the sequences it held.
struct StepRecord {
  double end_s = 0;
  double ms = 0;
  int sequences = 0;
};

struct ContinuousResult {
  ContinuousOptions options;
  TargetModel model;
  int layers = 0;
  double warmup_s = 0;  // the measured window is [warmup_s, end_s]
  double end_s = 0;
  std::vector<CallRecord> calls;
  std::vector<StepRecord> steps;
  std::vector<SequenceRecord> sequences;
  std::vector<AdmissionError> admission_errors;
};

// Registers the system prompts, runs the traffic for warmup + duration, and releases
// everything it created (also on failure). INVALID_ARGUMENT for options the target cannot
// take (more sequences per rank than its max batch); a call that fails is recorded, not
// returned.
absl::StatusOr<ContinuousResult> RunContinuous(LoadTarget& target,
                                               const ContinuousOptions& options);

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_CONTINUOUS_H_
