#include "client/loadgen/continuous.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/loadgen/query_pool.h"
#include "common/status_macros.h"
#include "kernels/core/random_fill.h"

namespace mlaserve::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

// What the ranks and the arrival process share.
class Traffic {
 public:
  Traffic(LoadTarget& target, const ContinuousOptions& o, const TargetModel& model, int layers,
          std::vector<std::string> prompt_ids)
      : target_(target),
        o_(o),
        model_(model),
        layers_(layers),
        prompt_ids_(std::move(prompt_ids)),
        pool_(model, o.sq, o.seed) {
    Rng rng(o.seed + 2);
    context_rows_.resize(static_cast<size_t>(o.context.max()) * model.dk());
    FillNormal(context_rows_, 1.0, rng);
  }

  // The run's clock starts here, once everything is generated, just before the threads.
  void Start() {
    start_ = Clock::now();
    end_ = start_ + absl::ToChronoNanoseconds(o_.warmup + o_.duration);
  }

  double Now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double EndSeconds() const { return std::chrono::duration<double>(end_ - start_).count(); }

  void ArrivalLoop() {
    TrafficRng rng(o_.seed);
    double t = 0;
    while (true) {
      t += o_.arrivals.NextGap(rng);
      if (t >= EndSeconds()) break;
      std::this_thread::sleep_until(
          start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t)));
      std::lock_guard lock(mu_);
      waiting_.push_back(NewSequence(rng, t));
      cv_.notify_one();
    }
  }

  void RankLoop(int rank) {
    TrafficRng rng(o_.seed * 7919 + static_cast<uint64_t>(rank) + 1);
    std::vector<Live> held;
    std::vector<CallRecord> calls;
    std::vector<StepRecord> steps;
    int64_t draw = rank;
    int64_t serial = 0;
    while (Clock::now() < end_) {
      const Clock::time_point step_start = Clock::now();
      const bool refused = !Admit(rank, rng, serial, held);
      if (held.empty()) {
        if (refused) {
          // The server refuses admissions: do not spin on it.
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        } else {
          std::unique_lock lock(mu_);
          cv_.wait_until(lock, end_, [&] { return !waiting_.empty(); });
        }
        continue;
      }
      bool failed = false;
      for (int l = 0; l < layers_ && !failed; ++l) {
        std::vector<LoadQuery> queries;
        queries.reserve(held.size());
        for (const Live& s : held) {
          queries.push_back(pool_.Query(draw++, s.id, l, o_.head_space, s.position));
        }
        CallRecord record;
        record.queries = static_cast<int>(queries.size());
        const Clock::time_point sent = Clock::now();
        absl::StatusOr<std::vector<LoadAnswer>> answers = target_.Decode(queries);
        record.start_s = std::chrono::duration<double>(sent - start_).count();
        record.latency_us = std::chrono::duration<double, std::micro>(Clock::now() - sent).count();
        if (o_.progress != nullptr) {
          o_.progress->Record(record.latency_us, record.queries, answers.ok());
        }
        if (answers.ok()) {
          record.answers = *std::move(answers);
        } else {
          record.code = answers.status().code();
          failed = true;
        }
        calls.push_back(std::move(record));
      }
      if (failed) {
        // Earlier layers of the step may have appended their rows: the sequences' state is
        // uncertain, so they go (unfinished, their failed call counted by code) and the rank
        // admits new ones.
        RetireAll(held, /*abandoned=*/true);
        continue;
      }
      const double now = Now();
      const double ms =
          std::chrono::duration<double, std::milli>(Clock::now() - step_start).count();
      steps.push_back(StepRecord{now, ms, static_cast<int>(held.size())});
      std::erase_if(held, [&](Live& s) {
        ++s.position;
        ++s.record->steps;
        s.record->step_ms_sum += ms;
        if (s.record->steps < s.record->planned_steps) return false;
        s.record->finished_s = now;
        target_.ReleaseSequence(s.id).IgnoreError();
        return true;
      });
    }
    RetireAll(held);
    std::lock_guard lock(mu_);
    for (CallRecord& c : calls) calls_.push_back(std::move(c));
    steps_.insert(steps_.end(), steps.begin(), steps.end());
  }

  void Collect(ContinuousResult& result) {
    std::lock_guard lock(mu_);
    result.calls = std::move(calls_);
    std::sort(result.calls.begin(), result.calls.end(),
              [](const CallRecord& a, const CallRecord& b) { return a.start_s < b.start_s; });
    result.steps = std::move(steps_);
    std::sort(result.steps.begin(), result.steps.end(),
              [](const StepRecord& a, const StepRecord& b) { return a.end_s < b.end_s; });
    result.sequences.assign(records_.begin(), records_.end());
    result.admission_errors = std::move(admission_errors_);
  }

 private:
  struct Live {
    std::string id;
    int64_t position = 0;
    SequenceRecord* record = nullptr;
  };

  // Under mu_. A deque: records keep their address as more arrive.
  SequenceRecord* NewSequence(TrafficRng& rng, double arrived_s) {
    SequenceRecord& r = records_.emplace_back();
    r.arrived_s = arrived_s;
    r.prompt = o_.prompts.Draw(rng);
    r.context_tokens = o_.context.Draw(rng);
    r.planned_steps = o_.steps.Draw(rng);
    return &r;
  }

  // Admits sequences until the rank is full or none waits. False if the server refused one
  // (in an open-loop run it waits on, at the front of the queue).
  bool Admit(int rank, TrafficRng& rng, int64_t& serial, std::vector<Live>& held) {
    while (static_cast<int>(held.size()) < o_.sequences && Clock::now() < end_) {
      SequenceRecord* record = nullptr;
      {
        std::lock_guard lock(mu_);
        if (o_.arrivals.open_loop()) {
          if (waiting_.empty()) return true;
          record = waiting_.front();
          waiting_.pop_front();
        } else {
          record = NewSequence(rng, Now());
        }
      }
      Live s;
      s.id = absl::StrCat(o_.run_id, "/r", rank, "/q", serial++);
      s.record = record;
      const std::string& prefix = record->prompt >= 0 ? prompt_ids_[record->prompt] : kNoPrefix;
      const int prefix_tokens = record->prompt >= 0 ? o_.prompts.tokens[record->prompt] : 0;
      absl::Status status = target_.CreateSequence(s.id, prefix, o_.kv_dtype);
      const bool created = status.ok();
      const std::span<const Bf16> rows =
          std::span<const Bf16>(context_rows_)
              .first(static_cast<size_t>(record->context_tokens) * model_.dk());
      for (int l = 0; l < layers_ && status.ok(); ++l) {
        status = target_.AppendKv(s.id, l, prefix_tokens, rows);
      }
      if (!status.ok()) {
        if (created) target_.ReleaseSequence(s.id).IgnoreError();
        std::lock_guard lock(mu_);
        admission_errors_.push_back({Now(), absl::StatusCodeToString(status.code())});
        if (o_.arrivals.open_loop()) waiting_.push_front(record);
        return false;  // the server is refusing: try again after the next step
      }
      record->admitted_s = Now();
      s.position = prefix_tokens + record->context_tokens;
      held.push_back(std::move(s));
    }
    return true;
  }

  // Releases what the rank holds; `abandoned` marks them retired unfinished by a failure.
  void RetireAll(std::vector<Live>& held, bool abandoned = false) {
    for (const Live& s : held) {
      target_.ReleaseSequence(s.id).IgnoreError();
      s.record->abandoned = abandoned;
    }
    held.clear();
  }

  static inline const std::string kNoPrefix;

  LoadTarget& target_;
  const ContinuousOptions& o_;
  const TargetModel& model_;
  const int layers_;
  const std::vector<std::string> prompt_ids_;
  const QueryPool pool_;
  std::vector<Bf16> context_rows_;
  Clock::time_point start_;
  Clock::time_point end_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SequenceRecord> records_;
  std::deque<SequenceRecord*> waiting_;
  std::vector<CallRecord> calls_;
  std::vector<StepRecord> steps_;
  std::vector<AdmissionError> admission_errors_;
};

}  // namespace

absl::StatusOr<ContinuousResult> RunContinuous(LoadTarget& target, const ContinuousOptions& o) {
  if (o.ranks < 1 || o.sequences < 1 || o.sq < 1) {
    return absl::InvalidArgumentError("continuous: --workers, --sequences and --sq must be >= 1");
  }
  if (o.duration <= absl::ZeroDuration() || o.warmup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "continuous: --duration-s must be above 0 and --warmup-s at least 0");
  }
  ContinuousResult result;
  result.options = o;
  ASSIGN_OR_RETURN(result.model, target.Model());
  const TargetModel& m = result.model;
  result.layers = o.layers > 0 ? std::min(o.layers, m.layers) : m.layers;
  if (m.max_batch > 0 && o.sequences > m.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "continuous: --sequences ", o.sequences, " exceeds the server's max batch ", m.max_batch));
  }

  std::vector<std::string> prompt_ids;
  auto release_prompts = [&] {
    for (const std::string& id : prompt_ids) target.ReleasePrefix(id).IgnoreError();
  };
  Rng rng(o.seed + 1);
  for (size_t i = 0; i < o.prompts.tokens.size(); ++i) {
    const int tokens = o.prompts.tokens[i];
    std::vector<Bf16> latent(static_cast<size_t>(m.layers) * tokens * m.dk());
    FillNormal(latent, 1.0, rng);
    const std::string id = absl::StrCat(o.run_id, "/system-prompt-", i);
    if (absl::Status s = target.RegisterPrefix(id, latent, tokens, o.kv_dtype); !s.ok()) {
      release_prompts();
      return s;
    }
    prompt_ids.push_back(id);
  }

  Traffic traffic(target, o, m, result.layers, prompt_ids);
  traffic.Start();
  std::vector<std::thread> threads;
  if (o.arrivals.open_loop()) threads.emplace_back([&traffic] { traffic.ArrivalLoop(); });
  for (int r = 0; r < o.ranks; ++r) threads.emplace_back([&traffic, r] { traffic.RankLoop(r); });
  for (std::thread& t : threads) t.join();
  result.warmup_s = absl::ToDoubleSeconds(o.warmup);
  result.end_s = traffic.EndSeconds();
  traffic.Collect(result);
  release_prompts();
  return result;
}

}  // namespace mlaserve::loadgen
