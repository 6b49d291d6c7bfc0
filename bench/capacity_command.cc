#include "bench/capacity_command.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/host_description.h"
#include "common/status_macros.h"
#include "kernels/core/random_fill.h"
#include "nlohmann/json.hpp"
#include "server/engine/engine.h"
#include "server/engine/owned_decode_query.h"

namespace mlaserve::bench {
namespace {

constexpr int kMaxBatch = 256;

struct Measured {
  int sequences = 0;
  int64_t tokens = 0;
  double modeled_ms = 0;  // per step, best of the measured rounds
  double host_ms = 0;     // per step, wall, best of the measured rounds
};

// One decode call over `queries`; its batches' modelled time (each device batch once).
absl::StatusOr<double> DecodeCall(engine::Engine& e,
                                  std::span<const engine::OwnedDecodeQuery> queries) {
  std::vector<engine::OwnedDecodeQuery> call(queries.begin(), queries.end());
  std::promise<absl::StatusOr<double>> promise;
  e.Decode(engine::Views(call, e.Info().model), {},
           [&](absl::StatusOr<std::span<const engine::DecodeAnswer>> answers) {
             if (!answers.ok()) {
               promise.set_value(answers.status());
               return;
             }
             promise.set_value(answers->front().plan.device_modeled_us / 1e3);
           });
  return promise.get_future().get();
}

absl::StatusOr<Measured> Measure(const CapacityCommandOptions& o, KvDtype dtype) {
  engine::EngineOptions e;
  ASSIGN_OR_RETURN(e.model, engine::PresetModelConfig(o.model, {.layers = 1}));
  e.weights.seed = 1;
  e.profile = o.profile;
  e.devices = 1;
  e.host_threads_per_device = o.host_threads;
  e.kv.budget_bytes = o.budget_mib << 20;
  e.kv.default_kv_dtype = dtype;
  e.max_batch = kMaxBatch;
  e.max_queue = kMaxBatch;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, engine::CreateEngine(e));
  const engine::ModelConfig& m = engine->Info().model;
  const int dk = m.dk_latent();
  Rng rng(11);
  std::vector<Bf16> rows(static_cast<size_t>(o.context) * dk);
  FillNormal(rows, 0.1, rng);  // the same rows for every sequence: filling is not measured
  const auto view = *TensorView<const Bf16, 2>::Create(rows, {o.context, dk});

  Measured r;
  std::vector<engine::OwnedDecodeQuery> queries;
  for (;; ++r.sequences) {
    const std::string id = absl::StrCat("s", r.sequences);
    RETURN_IF_ERROR(engine->CreateSequence(id, ""));
    const absl::Status appended = engine->AppendKv(id, 0, 0, view);
    if (absl::IsResourceExhausted(appended)) {
      RETURN_IF_ERROR(engine->ReleaseSequence(id));
      break;
    }
    RETURN_IF_ERROR(appended);
    engine::OwnedDecodeQuery q;
    q.sequence_id = id;
    q.q_nope.resize(static_cast<size_t>(m.heads) * m.dn);
    q.q_pe.resize(static_cast<size_t>(m.heads) * m.dr);
    FillNormal(q.q_nope, 0.1, rng);
    FillNormal(q.q_pe, 0.1, rng);
    queries.push_back(std::move(q));
  }
  r.tokens = int64_t{r.sequences} * o.context;
  for (int round = 0; round < std::max(2, o.rounds); ++round) {
    double modeled_ms = 0;
    const auto start = std::chrono::steady_clock::now();
    for (size_t first = 0; first < queries.size(); first += kMaxBatch) {
      const size_t n = std::min<size_t>(kMaxBatch, queries.size() - first);
      ASSIGN_OR_RETURN(const double ms, DecodeCall(*engine, std::span(queries).subspan(first, n)));
      modeled_ms += ms;
    }
    const double host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (round == 0) continue;  // warm-up
    r.modeled_ms = r.modeled_ms == 0 ? modeled_ms : std::min(r.modeled_ms, modeled_ms);
    r.host_ms = r.host_ms == 0 ? host_ms : std::min(r.host_ms, host_ms);
  }
  return r;
}

}  // namespace

absl::Status RunCapacityCommand(const CapacityCommandOptions& o, std::ostream& out) {
  if (o.budget_mib <= 0 || o.context <= 0) {
    return absl::InvalidArgumentError("capacity: budget and context must be positive");
  }
  ASSIGN_OR_RETURN(const Measured bf16, Measure(o, KvDtype::kBf16));
  ASSIGN_OR_RETURN(const Measured fp8, Measure(o, KvDtype::kFp8));
  auto per_s = [](const Measured& m, double ms) { return ms > 0 ? m.sequences / (ms / 1e3) : 0; };
  if (o.json) {
    for (const auto& [name, m] : {std::pair{"bf16", bf16}, std::pair{"fp8", fp8}}) {
      out << nlohmann::json{{"format", name},
                            {"model", o.model},
                            {"profile", o.profile},
                            {"budget_mib", o.budget_mib},
                            {"context", o.context},
                            {"sequences", m.sequences},
                            {"tokens", m.tokens},
                            {"modeled_ms_per_step", m.modeled_ms},
                            {"modeled_queries_per_s", per_s(m, m.modeled_ms)},
                            {"host_ms_per_step", m.host_ms},
                            {"host_queries_per_s", per_s(m, m.host_ms)}}
                 .dump()
          << "\n";
    }
    return absl::OkStatus();
  }
  out << HostDescription() << "\n";
  out << absl::StrFormat(
      "KV-bound decode: %s (1 layer) on one %s, KV budget %d MiB, sequences of %d tokens, as "
      "many as fit; one step decodes every held sequence (head space, batches of <= %d)\n\n",
      o.model, o.profile, o.budget_mib, o.context, kMaxBatch);
  out << absl::StrFormat("%-6s %9s %11s %14s %13s %12s %11s\n", "format", "sequences", "tokens",
                         "modeled_ms/step", "modeled_q/s", "host_ms/step", "host_q/s");
  for (const auto& [name, m] : {std::pair{"bf16", bf16}, std::pair{"fp8", fp8}}) {
    out << absl::StrFormat("%-6s %9d %11d %14.3f %13.0f %12.1f %11.1f\n", name, m.sequences,
                           m.tokens, m.modeled_ms, per_s(m, m.modeled_ms), m.host_ms,
                           per_s(m, m.host_ms));
  }
  out << absl::StrFormat(
      "\nfp8/bf16: tokens held %.2fx, modelled queries/s %.2fx, host queries/s %.2fx\n",
      static_cast<double>(fp8.tokens) / std::max<int64_t>(1, bf16.tokens),
      per_s(fp8, fp8.modeled_ms) / std::max(1e-9, per_s(bf16, bf16.modeled_ms)),
      per_s(fp8, fp8.host_ms) / std::max(1e-9, per_s(bf16, bf16.host_ms)));
  return absl::OkStatus();
}

}  // namespace mlaserve::bench
