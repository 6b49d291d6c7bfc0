#ifndef MLASERVE_CLIENT_LOADGEN_PROGRESS_H_
#define MLASERVE_CLIENT_LOADGEN_PROGRESS_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mlaserve::loadgen {

// How a run shows it is alive: one line rewritten in place on a terminal, plain lines (for
// logs and CI) otherwise, or nothing (--quiet).
enum class ProgressMode { kQuiet, kTerminal, kLines };

// kQuiet if `quiet`, else kTerminal when `fd` is a terminal, else kLines.
ProgressMode ProgressModeFor(bool quiet, int fd);

struct ProgressSnapshot {
  double elapsed_s = 0;
  int64_t calls = 0;
  int64_t queries = 0;
  int64_t errors = 0;
  double p99_ms = 0;  // of the calls so far; 0 before the first
};

// "[  12.0 s] 340 calls, 1234.5 queries/s, p99 45.21 ms, 0 errors".
std::string FormatProgress(const ProgressSnapshot& snapshot);

// Collects every call's latency and outcome from the run's workers and prints a snapshot
// every `every` (kTerminal) or every 10 x `every` (kLines) from its own thread, until
// destroyed. Thread-safe.
class Progress {
 public:
  Progress(ProgressMode mode, std::ostream& out, absl::Duration every = absl::Seconds(1));
  // Stops printing; on a terminal, ends the live line.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Record(double latency_us, int queries, bool ok);
  ProgressSnapshot Snapshot();

 private:
  void Run();

  const ProgressMode mode_;
  std::ostream& out_;
  const absl::Duration every_;
  const absl::Time start_ = absl::Now();
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
  std::vector<double> latencies_us_;
  int64_t queries_ = 0;
  int64_t errors_ = 0;
  bool printed_ = false;
  std::thread thread_;  // last: starts once the rest exists
};

}  // namespace mlaserve::loadgen

#endif  // MLASERVE_CLIENT_LOADGEN_PROGRESS_H_
