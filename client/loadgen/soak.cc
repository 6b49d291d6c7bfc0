#include "client/loadgen/soak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/loadgen/http_get.h"
#include "client/loadgen/prometheus_text.h"
#include "client/tensor_helpers.h"
#include "kernels/core/random_fill.h"

namespace mlaserve::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

// Random rows every KV row of the run is drawn from (by index, so the churn book stays
// small), and random latent queries. Unit sigma, as the repository's end-to-end tests use.
constexpr int kRowPool = 4096;
constexpr int kQueryPool = 16;
// A checked call waits here for the checker thread; beyond this many the check is skipped
// (and counted) rather than stalling a worker, which must keep its call in flight.
constexpr size_t kMaxPendingChecks = 16;
// A failed call is retried after this pause, so a server in trouble is not hammered.
constexpr auto kRetryPause = std::chrono::milliseconds(50);

struct ModelShape {
  int heads = 0, dk = 0, dl = 0, layers = 0, sq = 1;
  double scale = 0;
};

struct Pools {
  std::vector<Bf16> rows;     // [kRowPool][dk]
  std::vector<Bf16> queries;  // [kQueryPool][sq][heads][dk]
  int64_t query_size = 0;
  int dk = 0;

  std::span<const Bf16> Row(int32_t i) const {
    return std::span<const Bf16>(rows).subspan(static_cast<size_t>(i) * dk, dk);
  }
  std::span<const Bf16> Query(int i) const {
    return std::span<const Bf16>(queries).subspan(static_cast<size_t>(i) * query_size, query_size);
  }
  std::vector<Bf16> Gather(std::span<const int32_t> indices) const {
    std::vector<Bf16> out;
    out.reserve(indices.size() * dk);
    for (int32_t i : indices) {
      std::span<const Bf16> r = Row(i);
      out.insert(out.end(), r.begin(), r.end());
    }
    return out;
  }
};

v1::Tensor RowsTensor(const Pools& pools, std::span<const int32_t> indices) {
  const std::vector<Bf16> rows = pools.Gather(indices);
  const std::vector<int64_t> shape{static_cast<int64_t>(indices.size()), pools.dk};
  return client::Bf16Tensor(rows, shape);
}

// One checked decode call: what was asked, what the sequences held, what came back.
struct CheckJob {
  std::vector<int> query_index;            // into the query pool, per answer
  std::vector<std::vector<int32_t>> keys;  // per answer: the sequence's rows after the append
  std::vector<std::string> sequence_ids;
  v1::DecodeResponse response;
};

// Everything the workers, the checker and the sampler add to, under one mutex.
class Tally {
 public:
  explicit Tally(SoakResult& result) : r_(result) {}

  void Call(const char* rpc, const absl::Status& status) {
    std::lock_guard lock(mu_);
    ++r_.calls;
    ++r_.calls_by_rpc[rpc];
    if (status.ok()) return;
    ++r_.errors[absl::StatusCodeToString(status.code())];
    if (r_.first_error.empty()) r_.first_error = absl::StrCat(rpc, ": ", status.ToString());
  }
  void Queries(int64_t n) {
    std::lock_guard lock(mu_);
    r_.decode_queries += n;
  }
  void Skipped(int64_t n) {
    std::lock_guard lock(mu_);
    r_.skipped_checks += n;
  }
  void Checked(const AnswerCheck& c, const std::string& what) {
    std::lock_guard lock(mu_);
    ++r_.checked_answers;
    AnswerCheck& w = r_.worst;
    w.max_abs_out = std::max(w.max_abs_out, c.max_abs_out);
    w.max_abs_lse = std::max(w.max_abs_lse, c.max_abs_lse);
    w.cos_diff = std::max(w.cos_diff, c.cos_diff);
    w.worst_bound_ratio = std::max(w.worst_bound_ratio, c.worst_bound_ratio);
    if (c.ok) return;
    ++r_.wrong_answers;
    w.ok = false;
    if (r_.first_wrong.empty()) r_.first_wrong = absl::StrCat(what, ": ", c.why);
  }
  void Sample(const ResourceSample& s) {
    std::lock_guard lock(mu_);
    r_.samples.push_back(s);
  }
  void ScrapeFailed(const absl::Status& status) {
    std::lock_guard lock(mu_);
    ++r_.scrape_failures;
    if (r_.first_scrape_error.empty()) r_.first_scrape_error = status.ToString();
  }
  void Churn(const ChurnCounts& c) {
    std::lock_guard lock(mu_);
    r_.churn.created += c.created;
    r_.churn.forked += c.forked;
    r_.churn.released += c.released;
    r_.churn.decode_steps += c.decode_steps;
  }

 private:
  std::mutex mu_;
  SoakResult& r_;
};

// Checks answers on a thread of its own, so workers keep their calls in flight.
class Checker {
 public:
  Checker(const Pools& pools, const ModelShape& shape, Tally& tally)
      : pools_(pools), shape_(shape), tally_(tally), thread_([this] { Loop(); }) {}
  ~Checker() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void Submit(CheckJob job) {
    {
      std::lock_guard lock(mu_);
      if (jobs_.size() >= kMaxPendingChecks) {
        tally_.Skipped(static_cast<int64_t>(job.keys.size()));
        return;
      }
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      CheckJob job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return done_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // done, and every submitted check ran
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      Check(job);
    }
  }

  void Check(const CheckJob& job) {
    absl::StatusOr<std::vector<client::DecodeOutput>> outputs =
        client::ToDecodeOutputs(job.response);
    for (size_t i = 0; i < job.keys.size(); ++i) {
      AnswerCheck c;
      if (!outputs.ok() || outputs->size() != job.keys.size()) {
        c.ok = false;
        c.why = outputs.ok()
                    ? absl::StrCat(outputs->size(), " answers to ", job.keys.size(), " queries")
                    : outputs.status().ToString();
      } else {
        const std::vector<Bf16> keys = pools_.Gather(job.keys[i]);
        c = CheckLatentAnswer(pools_.Query(job.query_index[i]), shape_.sq, shape_.heads, shape_.dk,
                              shape_.dl, keys, shape_.scale, (*outputs)[i].out, (*outputs)[i].lse);
      }
      tally_.Checked(c, absl::StrCat(job.sequence_ids[i], " (", job.keys[i].size(), " rows)"));
    }
  }

  const Pools& pools_;
  const ModelShape shape_;
  Tally& tally_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CheckJob> jobs_;
  bool done_ = false;
  std::thread thread_;  // last: starts once everything above exists
};

absl::StatusOr<ResourceSample> ScrapeResources(const std::string& target,
                                               const client::ClientTls& tls) {
  absl::StatusOr<std::string> body = HttpGet(target, "/metrics", absl::Seconds(10), tls);
  if (!body.ok()) return body.status();
  absl::StatusOr<std::vector<PrometheusSample>> samples = ParsePrometheusText(*body);
  if (!samples.ok()) return samples.status();
  ResourceSample s;
  for (auto [name, value] :
       {std::pair{"process_resident_memory_bytes", &s.rss_bytes},
        std::pair{"process_threads", &s.threads}, std::pair{"process_open_fds", &s.open_fds}}) {
    std::optional<double> v = FindSample(*samples, name);
    if (!v.has_value()) {
      return absl::NotFoundError(absl::StrCat(target, "/metrics has no ", name));
    }
    *value = *v;
  }
  std::optional<double> resident = FindSample(*samples, "mlaserve_kv_bytes", "kind=\"resident\"");
  if (!resident.has_value()) {
    return absl::NotFoundError(
        absl::StrCat(target, "/metrics has no mlaserve_kv_bytes{kind=\"resident\"}"));
  }
  s.kv_resident_bytes = *resident;
  s.heap_in_use_bytes = FindSample(*samples, "mlaserve_heap_in_use_bytes");
  return s;
}

absl::Status CheckAgainstServer(const SoakOptions& o, const v1::GetServerInfoResponse& info,
                                int layers, int max_own_rows) {
  const v1::Limits& limits = info.limits();
  if (limits.max_batch() > 0 && o.sequences > limits.max_batch()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sequences ", o.sequences, " exceeds the server's max batch ", limits.max_batch()));
  }
  if (limits.max_sq() > 0 && o.sq > limits.max_sq()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sq ", o.sq, " exceeds the server's max sq ", limits.max_sq()));
  }
  // At most every worker's call waits at once: below the queue limit, UNAVAILABLE from
  // admission cannot happen, so the run may count it as unexpected.
  if (limits.max_queue() > 0 && int64_t{o.workers} * o.sequences > limits.max_queue()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers x --sequences = ", int64_t{o.workers} * o.sequences,
        " queries could wait at once, over the server's queue limit ", limits.max_queue()));
  }
  // The peak latent footprint, counting every sequence's pages as its own (a fork shares its
  // source's until either appends) and one partial page per sequence and layer: below the
  // budget, RESOURCE_EXHAUSTED cannot happen either.
  int64_t bytes_per_token = 0;
  for (const v1::KvFormat& f : info.kv_formats()) {
    if (f.dtype() == v1::KV_DTYPE_BF16) bytes_per_token = f.bytes_per_token();
  }
  const int64_t page = std::max(info.page_size(), 1);
  const int64_t sequence_pages = (max_own_rows + page - 1) / page + 1;
  const int64_t prefix_pages = (o.prefix_tokens + page - 1) / page;
  const int64_t peak = (int64_t{o.workers} * o.sequences * sequence_pages + prefix_pages) * layers *
                       page * bytes_per_token;
  if (limits.kv_budget_bytes() > 0 && peak > limits.kv_budget_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers, --sequences, --prefix-tokens, --context-tokens and --soak-max-life need up "
        "to ",
        peak >> 20, " MiB of KV cache, over the server's budget of ",
        limits.kv_budget_bytes() >> 20, " MiB"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SoakResult> RunSoak(client::MlaServeClient& client, const SoakOptions& o) {
  if (o.metrics_target.empty()) {
    return absl::InvalidArgumentError(
        "--metrics-target: a soak reads the server's RSS, threads and descriptors from its "
        "/metrics (host:port of the server's --metrics_listen)");
  }
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  if (!info.ok()) return info.status();
  SoakResult result;
  result.options = o;
  const v1::ModelInfo& m = info->model();
  ModelShape shape{m.heads(), m.kv_row_width(), m.dl(), m.layers(), o.sq, m.softmax_scale()};
  if (o.layers > 0) shape.layers = std::min(o.layers, m.layers());
  result.model = m.name();
  result.heads = shape.heads;
  result.dk = shape.dk;
  result.dl = shape.dl;
  result.layers = shape.layers;
  result.softmax_scale = shape.scale;

  ChurnOptions churn;
  churn.sequences = o.sequences;
  churn.layers = shape.layers;
  churn.min_prompt = o.min_prompt;
  churn.max_prompt = o.max_prompt;
  churn.min_life = o.min_life;
  churn.max_life = o.max_life;
  churn.prefix_fraction = o.prefix_fraction;
  churn.fork_fraction = o.fork_fraction;
  churn.row_pool = kRowPool;
  churn.max_own_rows = o.max_prompt + 2 * o.max_life;
  if (absl::Status s = CheckAgainstServer(o, *info, shape.layers, churn.max_own_rows); !s.ok()) {
    return s;
  }

  Pools pools;
  pools.dk = shape.dk;
  pools.query_size = int64_t{o.sq} * shape.heads * shape.dk;
  pools.rows.resize(static_cast<size_t>(kRowPool) * shape.dk);
  pools.queries.resize(static_cast<size_t>(kQueryPool * pools.query_size));
  Rng rng(o.seed);
  FillNormal(pools.rows, 1.0, rng);
  FillNormal(pools.queries, 1.0, rng);

  // The shared prefix: registered once for every worker, in the bf16 cache whatever the
  // server's default (the tolerances are the bf16 cache's). Every layer the server serves
  // gets rows; the run decodes the first `shape.layers`.
  const std::string prefix_id = o.prefix_tokens > 0 ? absl::StrCat(o.run_id, "/prefix") : "";
  if (!prefix_id.empty()) {
    std::uniform_int_distribution<int32_t> draw(0, kRowPool - 1);
    churn.prefix_rows.resize(shape.layers);
    std::vector<Bf16> latent;
    for (int l = 0; l < m.layers(); ++l) {
      std::vector<int32_t> rows(o.prefix_tokens);
      for (int32_t& r : rows) r = draw(rng);
      const std::vector<Bf16> gathered = pools.Gather(rows);
      latent.insert(latent.end(), gathered.begin(), gathered.end());
      if (l < shape.layers) churn.prefix_rows[l] = std::move(rows);
    }
    const std::vector<int64_t> dims{m.layers(), o.prefix_tokens, shape.dk};
    if (absl::Status s = client.RegisterPrefix(prefix_id, "", client::Bf16Tensor(latent, dims),
                                               v1::KV_DTYPE_BF16);
        !s.ok()) {
      return s;
    }
  }

  Tally tally(result);
  const Clock::time_point start = Clock::now();
  const Clock::time_point stop = start + absl::ToChronoNanoseconds(o.duration);
  auto since_start = [start] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopped = false;

  // The sampler reads the server's process metrics from the run's start to its end.
  std::thread sampler([&] {
    for (int i = 0;; ++i) {
      const Clock::time_point due = start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(i * o.sample_s));
      {
        std::unique_lock lock(stop_mu);
        if (stop_cv.wait_until(lock, std::min(due, stop), [&] { return stopped; })) return;
      }
      if (due > stop) return;
      const double t = since_start();
      absl::StatusOr<ResourceSample> s = ScrapeResources(o.metrics_target, o.metrics_tls);
      if (s.ok()) {
        s->t_s = t;
        tally.Sample(*s);
      } else {
        tally.ScrapeFailed(s.status());
      }
    }
  });

  {
    Checker checker(pools, shape, tally);
    auto worker = [&](int w) {
      ChurnBook book(churn, absl::StrCat(o.run_id, "/w", w), o.seed * 1000003 + w + 1);
      int64_t decode_calls = 0;
      int64_t draw = w;
      while (Clock::now() < stop) {
        const ChurnAction& a = book.Next();
        absl::Status status;
        std::optional<CheckJob> job;
        switch (a.step) {
          case ChurnStep::kCreate:
            status = client.CreateSequence(a.id, a.on_prefix ? prefix_id : "", v1::KV_DTYPE_BF16)
                         .status();
            break;
          case ChurnStep::kAppendPrompt: {
            std::vector<client::KvAppend> appends(shape.layers);
            for (int l = 0; l < shape.layers; ++l) {
              appends[l].sequence_id = a.id;
              appends[l].layer = l;
              appends[l].start_position = a.position;
              appends[l].rows = RowsTensor(pools, a.prompt[l]);
            }
            status = client.AppendKv(appends);
            break;
          }
          case ChurnStep::kFork:
            status = client.ForkSequence(a.source_id, a.id).status();
            break;
          case ChurnStep::kRelease:
            status = client.ReleaseSequence(a.id);
            break;
          case ChurnStep::kDecode: {
            v1::DecodeRequest request;
            std::vector<int> query_index;
            const std::vector<int64_t> q_dims{o.sq, shape.heads, shape.dk};
            for (size_t q = 0; q < a.slots.size(); ++q) {
              const int qi = static_cast<int>(draw++ % kQueryPool);
              query_index.push_back(qi);
              v1::DecodeQuery query =
                  client::LatentQuery(book.slot(a.slots[q]).id, a.layer, o.sq,
                                      client::Bf16Tensor(pools.Query(qi), q_dims));
              client::AppendBeforeDecode(query, RowsTensor(pools, {&a.appends[q], 1}),
                                         a.positions[q]);
              *request.add_queries() = std::move(query);
            }
            request.set_output_dtype(v1::DTYPE_BF16);
            absl::StatusOr<v1::DecodeResponse> response = client.DecodeRaw(request);
            status = response.status();
            if (response.ok()) {
              tally.Queries(static_cast<int64_t>(a.slots.size()));
              if (++decode_calls % o.check_every == 0) {
                job.emplace();
                job->query_index = std::move(query_index);
                job->response = *std::move(response);
              }
            }
            break;
          }
        }
        tally.Call(ChurnStepName(a.step), status);
        if (!status.ok()) {
          std::this_thread::sleep_for(kRetryPause);
          continue;  // Next() hands the same call again
        }
        const std::vector<int> slots = a.slots;
        const int layer = a.layer;
        book.Done();
        if (job.has_value()) {
          // The keys as they are now: the call's appended rows included.
          for (int slot : slots) {
            job->keys.push_back(book.KeyRows(slot, layer));
            job->sequence_ids.push_back(book.slot(slot).id);
          }
          checker.Submit(*std::move(job));
        }
      }
      // Whatever the server still holds of this worker goes; a failed release is an error
      // like any other.
      for (const std::string& id : book.LiveIds()) {
        tally.Call("ReleaseSequence", client.ReleaseSequence(id));
      }
      tally.Churn(book.counts());
    };
    std::vector<std::thread> threads;
    for (int w = 0; w < o.workers; ++w) threads.emplace_back(worker, w);
    for (std::thread& t : threads) t.join();
    result.wall_s = since_start();
    {
      std::lock_guard lock(stop_mu);
      stopped = true;
    }
    stop_cv.notify_all();
    sampler.join();
  }  // the checker finishes the checks already submitted

  if (!prefix_id.empty()) tally.Call("ReleasePrefix", client.ReleasePrefix(prefix_id));

  absl::StatusOr<ResourceDrift> drift = ComputeResourceDrift(result.samples, o.warmup_s);
  if (drift.ok()) {
    result.drift = *drift;
  } else {
    result.drift_error = std::string(drift.status().message());
  }

  std::vector<std::string>& f = result.failures;
  if (result.wrong_answers > 0) {
    f.push_back(
        absl::StrCat(result.wrong_answers, " wrong answers (first: ", result.first_wrong, ")"));
  }
  if (!result.errors.empty()) {
    std::vector<std::string> codes;
    for (const auto& [code, n] : result.errors) codes.push_back(absl::StrCat(code, " ", n));
    f.push_back(absl::StrCat("unexpected errors: ", absl::StrJoin(codes, ", "),
                             " (first: ", result.first_error, ")"));
  }
  if (result.checked_answers == 0) {
    f.push_back("no answer was checked: lower --soak-check-every or lengthen --duration-s");
  }
  if (!result.drift.has_value()) {
    f.push_back(
        absl::StrCat("no drift: ", result.drift_error,
                     result.first_scrape_error.empty()
                         ? ""
                         : absl::StrCat(" (scrapes failed: ", result.first_scrape_error, ")")));
  } else if (result.drift->rss_outside_kv.drift > o.max_rss_drift) {
    f.push_back(absl::StrCat("RSS drift outside the KV pool ",
                             result.drift->rss_outside_kv.drift * 100,
                             " % over --soak-max-rss-drift ", o.max_rss_drift * 100, " %"));
  }
  return result;
}

double DefaultMaxRssDrift(double duration_s, double warmup_s) {
  return warmup_s >= kLongRunWarmupS && duration_s - warmup_s >= kLongRunMeasuredS
             ? kLongRunMaxRssDrift
             : kShortRunMaxRssDrift;
}

}  // namespace mlaserve::loadgen
