#include "client/loadgen/workload.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/loadgen/query_pool.h"
#include "common/status_macros.h"
#include "kernels/core/random_fill.h"

namespace mlaserve::loadgen {
namespace {

std::string SequenceId(const WorkloadOptions& o, int worker, int s) {
  return absl::StrCat(o.run_id, "/w", worker, "/s", s);
}

}  // namespace

absl::StatusOr<LoadResult> RunWorkload(LoadTarget& target, const WorkloadOptions& o) {
  if (o.workers < 1 || o.sequences < 1 || o.prefix_tokens < 0 || o.context_tokens < 0 || o.sq < 1 ||
      o.prefix_tokens + o.context_tokens < 1) {
    return absl::InvalidArgumentError(
        "workload: need workers, sequences, sq >= 1 and at least one prefix or context token");
  }
  LoadResult result;
  result.options = o;
  ASSIGN_OR_RETURN(result.model, target.Model());
  const TargetModel& m = result.model;
  const int layers = o.layers > 0 ? std::min(o.layers, m.layers) : m.layers;
  if (m.max_batch > 0 && o.sequences > m.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "workload: --sequences ", o.sequences, " exceeds the server's max batch ", m.max_batch));
  }
  const QueryPool pool(m, o.sq, o.seed);
  const std::string prefix = o.prefix_tokens > 0 ? absl::StrCat(o.run_id, "/system-prompt") : "";

  // Everything created is released at the end, whatever happens in between.
  std::vector<std::string> created;
  auto release_all = [&] {
    for (const std::string& id : created) target.ReleaseSequence(id).IgnoreError();
    if (!prefix.empty()) target.ReleasePrefix(prefix).IgnoreError();
  };
  auto setup = [&]() -> absl::Status {
    Rng rng(o.seed + 1);
    if (!prefix.empty()) {
      std::vector<Bf16> latent(int64_t{m.layers} * o.prefix_tokens * m.dk());
      FillNormal(latent, 1.0, rng);
      RETURN_IF_ERROR(target.RegisterPrefix(prefix, latent, o.prefix_tokens, o.kv_dtype));
    }
    std::vector<Bf16> context(int64_t{o.context_tokens} * m.dk());
    FillNormal(context, 1.0, rng);
    for (int w = 0; w < o.workers; ++w) {
      for (int s = 0; s < o.sequences; ++s) {
        const std::string id = SequenceId(o, w, s);
        RETURN_IF_ERROR(target.CreateSequence(id, prefix, o.kv_dtype));
        created.push_back(id);
        if (o.context_tokens == 0) continue;
        for (int l = 0; l < layers; ++l) {
          RETURN_IF_ERROR(target.AppendKv(id, l, o.prefix_tokens, context));
        }
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status status = setup(); !status.ok()) {
    release_all();
    return status;
  }

  std::mutex mu;
  std::vector<int64_t> steps(o.workers, 0);
  const auto start = std::chrono::steady_clock::now();
  const auto stop = start + absl::ToChronoNanoseconds(o.duration);
  auto since_start = [&start](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(t - start).count();
  };
  auto worker = [&](int w) {
    std::vector<CallRecord> mine;
    int64_t position = o.prefix_tokens + o.context_tokens;
    int64_t draw = w;
    bool give_up = false;
    while (!give_up && std::chrono::steady_clock::now() < stop) {
      bool failed = false;
      for (int l = 0; l < layers && !failed; ++l) {
        std::vector<LoadQuery> queries(o.sequences);
        for (int s = 0; s < o.sequences; ++s) {
          queries[s] = pool.Query(draw++, SequenceId(o, w, s), l, o.head_space, position);
        }
        CallRecord record;
        record.queries = o.sequences;
        record.warmup = steps[w] == 0;
        const auto sent = std::chrono::steady_clock::now();
        absl::StatusOr<std::vector<LoadAnswer>> answers = target.Decode(queries);
        const auto answered = std::chrono::steady_clock::now();
        record.start_s = since_start(sent);
        record.latency_us = std::chrono::duration<double, std::micro>(answered - sent).count();
        if (o.progress != nullptr) o.progress->Record(record.latency_us, o.sequences, answers.ok());
        if (answers.ok()) {
          record.answers = *std::move(answers);
        } else {
          record.code = answers.status().code();
          failed = true;  // the step's appends are uncertain: retry the whole step
          // Only transient errors are worth retrying; anything else would fail again.
          give_up = record.code != absl::StatusCode::kUnavailable &&
                    record.code != absl::StatusCode::kDeadlineExceeded;
        }
        mine.push_back(std::move(record));
      }
      if (!failed) {
        ++position;
        ++steps[w];
      }
    }
    std::lock_guard lock(mu);
    for (CallRecord& r : mine) result.calls.push_back(std::move(r));
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < o.workers; ++w) threads.emplace_back(worker, w);
  for (std::thread& t : threads) t.join();
  result.wall_s = since_start(std::chrono::steady_clock::now());
  for (int64_t s : steps) result.tokens += s * o.sequences;
  std::sort(result.calls.begin(), result.calls.end(),
            [](const CallRecord& a, const CallRecord& b) { return a.start_s < b.start_s; });
  release_all();
  return result;
}

}  // namespace mlaserve::loadgen
