#include "client/loadgen/progress.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"

namespace mlaserve::loadgen {

ProgressMode ProgressModeFor(bool quiet, int fd) {
  if (quiet) return ProgressMode::kQuiet;
  return isatty(fd) ? ProgressMode::kTerminal : ProgressMode::kLines;
}

std::string FormatProgress(const ProgressSnapshot& s) {
  const double rate = s.elapsed_s > 0 ? s.queries / s.elapsed_s : 0;
  return absl::StrFormat("[%6.1f s] %d calls, %.1f queries/s, p99 %.2f ms, %d errors", s.elapsed_s,
                         s.calls, rate, s.p99_ms, s.errors);
}

Progress::Progress(ProgressMode mode, std::ostream& out, absl::Duration every)
    : mode_(mode), out_(out), every_(every) {
  if (mode_ != ProgressMode::kQuiet) thread_ = std::thread([this] { Run(); });
}

Progress::~Progress() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The live line stays on screen as the run's last word before the report.
  if (mode_ == ProgressMode::kTerminal && printed_) out_ << "\n" << std::flush;
}

void Progress::Record(double latency_us, int queries, bool ok) {
  std::lock_guard lock(mu_);
  latencies_us_.push_back(latency_us);
  if (ok) {
    queries_ += queries;
  } else {
    ++errors_;
  }
}

ProgressSnapshot Progress::Snapshot() {
  std::lock_guard lock(mu_);
  ProgressSnapshot s;
  s.elapsed_s = absl::ToDoubleSeconds(absl::Now() - start_);
  s.calls = static_cast<int64_t>(latencies_us_.size());
  s.queries = queries_;
  s.errors = errors_;
  if (!latencies_us_.empty()) {
    // nth_element reorders the samples, which the percentile does not mind.
    const size_t k = (latencies_us_.size() * 99) / 100;
    std::nth_element(latencies_us_.begin(), latencies_us_.begin() + k, latencies_us_.end());
    s.p99_ms = latencies_us_[k] / 1000;
  }
  return s;
}

void Progress::Run() {
  const absl::Duration period = mode_ == ProgressMode::kTerminal ? every_ : 10 * every_;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (stop_cv_.wait_for(lock, absl::ToChronoNanoseconds(period), [this] { return stopped_; })) {
        return;
      }
    }
    const std::string line = FormatProgress(Snapshot());
    if (mode_ == ProgressMode::kTerminal) {
      out_ << "\r\033[K" << line << std::flush;  // erase to the end of the line, then rewrite
    } else {
      out_ << line << "\n" << std::flush;
    }
    printed_ = true;
  }
}

}  // namespace mlaserve::loadgen
